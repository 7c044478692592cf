"""``--criterion head_cross_entropy``: the head's own (memory-lean) NLL, label smoothing, aux loss."""
# no `from __future__ import annotations`: fairseq reads the dataclass annotations as real types

import math

import torch
from dataclasses import dataclass, field

from fairseq import metrics, utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from omegaconf import II

from hf_heads.heads import OutputHead


@dataclass
class HeadCrossEntropyConfig(FairseqDataclass):
    label_smoothing: float = field(
        default=0.0, metadata={"help": "epsilon for label smoothing, 0 means none (as label_smoothed_cross_entropy)"}
    )
    sentence_avg: bool = II("optimization.sentence_avg")


def find_head(model) -> OutputHead:
    """The softmax-heads head of a fairseq model (``model.decoder.head``), or a clear error."""
    head = getattr(getattr(model, "decoder", None), "head", None)
    if not isinstance(head, OutputHead):
        raise ValueError(
            "--criterion head_cross_entropy needs a model with an output head: use "
            "--arch head_ARCH (e.g. head_transformer_iwslt_de_en) with --user-dir fairseq_plugin"
        )
    return head


@register_criterion("head_cross_entropy", dataclass=HeadCrossEntropyConfig)
class HeadCrossEntropyCriterion(FairseqCriterion):
    """NLL from ``head.loss`` (never materialising more than the head needs), optional label
    smoothing with fairseq's formula, plus ``head.aux_loss()`` scaled to the summed loss.

    Logs ``loss`` (what is optimised) and ``nll_loss`` / ``ppl`` (base 2), like fairseq's own
    cross-entropy criteria, and ``aux_loss`` when a head has one.
    """

    def __init__(self, task, sentence_avg, label_smoothing=0.0):
        super().__init__(task)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"--label-smoothing={label_smoothing} is out of range; allowed: [0, 1)")
        self.sentence_avg = sentence_avg
        self.eps = label_smoothing

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        head = find_head(model)
        hidden = net_output[0]
        target = model.get_targets(sample, net_output)
        # fairseq's smoothing, (1 - eps - eps_i) nll + eps_i smooth with eps_i = eps / (V - 1), is the head's
        # (F.cross_entropy's) (1 - e) nll + (e / V) smooth with e = eps V / (V - 1); memory-lean in training
        vocab = head.config.vocab_size
        loss, nll = head.loss_and_nll(
            hidden,
            target,
            ignore_index=self.padding_idx,
            reduction="sum" if reduce else "none",
            label_smoothing=self.eps * vocab / (vocab - 1) if vocab > 1 else 0.0,
        )
        if not reduce:
            loss, nll = loss.view(-1), nll.view(-1)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        # a regulariser: validation losses stay the plain NLL
        aux = head.aux_loss() if model.training else hidden.new_zeros((), dtype=torch.float32)
        regularization = getattr(model.decoder, "regularization_loss", None)  # AWD-LSTM's AR / TAR
        if model.training and regularization is not None:
            aux = aux + regularization().float()
        if reduce:
            loss = loss + aux * sample_size  # the optimiser divides the summed loss by sample_size
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll.data,
            "aux_loss": aux.data * sample_size,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        loss_sum = sum(log.get("loss", 0) for log in logging_outputs)
        nll_sum = sum(log.get("nll_loss", 0) for log in logging_outputs)
        aux_sum = sum(log.get("aux_loss", 0) for log in logging_outputs)
        ntokens = sum(log.get("ntokens", 0) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss_sum / sample_size / math.log(2), sample_size, round=3)
        metrics.log_scalar("nll_loss", nll_sum / ntokens / math.log(2), ntokens, round=3)
        if utils.item(aux_sum) != 0:
            metrics.log_scalar("aux_loss", aux_sum / sample_size, sample_size, round=4)
        metrics.log_derived("ppl", lambda meters: utils.get_perplexity(meters["nll_loss"].avg))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
