"""The papers' language model in fairseq: AWD-LSTM with the MoS paper's settings, a softmax-heads head on top.

``--arch head_awd_lstm_lm`` (and the presets ``head_awd_lstm_lm_ptb`` / ``_wt2`` / ``_1b``) is the model of
zihangdai/mos (built on salesforce/awd-lstm-lm), which the Mixtape and PLIF papers use for their perplexity tables:

* an embedding (``--emsize``) with embedding dropout (``--dropoute``: whole words dropped, the rest rescaled),
* ``--nlayers`` single-layer LSTMs (``--nhid`` units, the last ``--nhidlast``) with DropConnect on the
  hidden-to-hidden matrices (``--wdrop``, a new mask every forward),
* locked (variational) dropout: one mask per sequence, shared over time, on the embeddings (``--dropouti``),
  between layers (``--dropouth``) and on the last layer's output (``--dropout``),
* the output head (``--output-head``, ``--head-options``) on the last layer's output (``hidden_size`` =
  ``--nhidlast``; ``--emsize`` for heads without a context projection, as AWD-LSTM ties), its output embedding
  tied to the input embedding (``embedding_size`` = ``--emsize``) as in the papers (``--untie-weights``: the
  head's own); ``--dropoutl`` (MoS: dropout on the contexts) becomes the head's ``dropout`` unless ``--head-options``
  sets it (the MoS code drops them with a locked mask; the heads use plain dropout),
* activation regularisation (``--alpha``: L2 of the dropped last output) and temporal activation regularisation
  (``--beta``: L2 of the change of the undropped output between steps), added to the training loss by
  ``head_cross_entropy`` (:meth:`AWDLSTMDecoder.regularization_loss`).

Trained and scored as the papers' code does (contiguous streams, the LSTM state carried from one window to the next,
variable BPTT with the learning rate scaled by it) with ``--task awd_language_modeling``
(:mod:`fairseq_plugin.lm.streams`); fairseq's ``language_modeling`` task gives each block of
``--tokens-per-sample`` tokens on its own, from a zero state. Beside that, the difference from the papers' code is
the plain dropout on the contexts; the averaged-SGD switch is :mod:`fairseq_plugin.lm.ntasgd`.
"""

import logging
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.models import FairseqDecoder, FairseqLanguageModel, register_model, register_model_architecture

import hf_heads

from ..models import HeadDecoderMixin
from ..options import HeadFlagError, add_head_args, build_decoder_head, parse_head_options, usage_error
from .streams import CarriedStates

logger = logging.getLogger(__name__)


def locked_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Variational dropout on ``x`` ``[batch, time, features]``: one mask per sequence, the same at every step."""
    if not training or p == 0.0:
        return x
    mask = x.new_empty(x.shape[0], 1, x.shape[2]).bernoulli_(1 - p) / (1 - p)
    return x * mask


def embedded_dropout(embed: nn.Embedding, tokens: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Embedding dropout: each word type's whole row dropped with probability ``p`` (the rest scaled by
    ``1 / (1 - p)``), the same for every occurrence in the batch."""
    weight = embed.weight
    if training and p > 0.0:
        mask = weight.new_empty(weight.shape[0], 1).bernoulli_(1 - p) / (1 - p)
        weight = weight * mask
    return F.embedding(tokens, weight, embed.padding_idx)


class WeightDropLSTM(nn.Module):
    """A one-layer LSTM with DropConnect on its hidden-to-hidden matrix (a new mask every forward in training)."""

    def __init__(self, input_size: int, hidden_size: int, weight_dropout: float):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, batch_first=True)
        self.weight_dropout = weight_dropout

    def forward(self, x: torch.Tensor, hx=None):
        """``(output, (h, c))`` of the LSTM on ``x`` ``[batch, time, input]`` from the state ``hx`` (zeros: None)."""
        if not self.training or self.weight_dropout == 0.0:
            return self.lstm(x, hx)
        dropped = F.dropout(self.lstm.weight_hh_l0, self.weight_dropout, training=True)
        return torch.func.functional_call(self.lstm, {"weight_hh_l0": dropped}, (x, hx))


class AWDLSTMDecoder(HeadDecoderMixin, FairseqDecoder):
    """Embedding -> LSTMs with weight drop and locked dropout -> features for the head (``self.head``)."""

    def __init__(self, args, dictionary):
        super().__init__(dictionary)
        for name in ("dropout", "dropouth", "dropouti", "dropoute", "wdrop", "dropoutl"):
            p = getattr(args, name)
            if not 0.0 <= p < 1.0:
                usage_error(f"--{name} {p} is out of range; allowed: [0, 1)")
        for name in ("emsize", "nhid", "nhidlast", "nlayers"):
            if getattr(args, name) < 1:
                usage_error(f"--{name} {getattr(args, name)} is out of range; allowed: >= 1")
        self.args = args
        self.embed_tokens = nn.Embedding(len(dictionary), args.emsize, padding_idx=dictionary.pad())
        nn.init.uniform_(self.embed_tokens.weight, -0.1, 0.1)  # as the MoS / AWD-LSTM code
        try:
            name, options = parse_head_options(args.output_head, args.head_options, getattr(args, "head_start", ""))
        except HeadFlagError as e:
            usage_error(str(e))
        options = {"dropout": args.dropoutl, **options}
        last = self.last_layer_size(args, name, options, len(dictionary))
        sizes = [args.emsize] + [args.nhid] * (args.nlayers - 1) + [last]
        self.rnns = nn.ModuleList(WeightDropLSTM(sizes[i], sizes[i + 1], args.wdrop) for i in range(args.nlayers))
        try:
            self.head = build_decoder_head(
                name, options, last, len(dictionary), None if args.untie_weights else self.embed_tokens
            )
        except HeadFlagError as e:
            hint = "; with --arch head_awd_lstm_lm pass --untie-weights" if "cannot be tied" in str(e) else ""
            usage_error(f"{e}{hint}")
        self._regularization: Optional[torch.Tensor] = None
        self._streams = CarriedStates()

    @staticmethod
    def last_layer_size(args, name: str, options, vocab_size: int) -> int:
        """``--nhidlast``, or ``--emsize`` for a tied head that multiplies its input with the embedding directly
        (softmax, sigsoftmax, PLIF, ...: no context projection), as AWD-LSTM sizes its last layer when tying."""
        if args.untie_weights or args.nhidlast == args.emsize:
            return args.nhidlast
        last = args.nhidlast if hf_heads.get_head_class(name).projects_context else args.emsize
        try:
            hf_heads.check_head_options(name, last, vocab_size, embedding_size=args.emsize, **options)
        except ValueError as e:
            usage_error(f"--output-head {name} --head-options: {e}")
        if last == args.nhidlast:
            return last
        logger.info(
            f"--output-head {name} has no context projection: the last LSTM layer has --emsize "
            f"{args.emsize} units (not --nhidlast {args.nhidlast}), so the head ties to the embedding"
        )
        return args.emsize

    def forward(self, prev_output_tokens, src_lengths=None, stream_key=None, stream_step=None, hidden=None, **kwargs):
        """Features of ``prev_output_tokens`` from the LSTM state ``hidden`` (zeros: None). ``stream_key`` /
        ``stream_step`` (batches of ``--task awd_language_modeling``): the state is the one this decoder kept at
        the end of the stream's previous window (:class:`fairseq_plugin.lm.streams.CarriedStates`)."""
        if stream_key is not None:
            hidden = self._streams.incoming(stream_key, int(stream_step), prev_output_tokens.shape[0])
        features, extra = self.extract_features(prev_output_tokens, hidden=hidden)
        if stream_key is not None:
            self._streams.store(stream_key, int(stream_step), hidden, extra["hidden"])
        return self.output_layer(features), extra

    def extract_features(self, prev_output_tokens, hidden=None, **kwargs):
        """``(features, extra)``: the last layer's (dropped) output, and in ``extra["hidden"]`` the final ``(h, c)``
        of every layer (each ``[1, batch, units]``), the state the next window of a stream starts from."""
        a = self.args
        x = embedded_dropout(self.embed_tokens, prev_output_tokens, a.dropoute, self.training)
        x = locked_dropout(x, a.dropouti, self.training)
        raw, final = x, []
        for i, rnn in enumerate(self.rnns):
            raw, state = rnn(x, None if hidden is None else hidden[i])
            final.append(state)
            x = locked_dropout(raw, a.dropouth, self.training) if i < len(self.rnns) - 1 else raw
        out = locked_dropout(raw, a.dropout, self.training)
        self._regularization = None
        if self.training and (a.alpha > 0 or a.beta > 0):
            mask = prev_output_tokens.ne(self.dictionary.pad()).unsqueeze(-1).to(out.dtype)
            ar = a.alpha * (out * mask).pow(2).sum() / (mask.sum() * out.shape[-1])
            tar = (
                a.beta
                * ((raw[:, 1:] - raw[:, :-1]) * mask[:, 1:]).pow(2).sum()
                / (mask[:, 1:].sum() * out.shape[-1]).clamp(min=1)
            )
            self._regularization = ar + tar
        return out, {"attn": None, "inner_states": None, "hidden": tuple(final)}

    def regularization_loss(self) -> torch.Tensor:
        """AR + TAR of the last training forward (mean squares, as AWD-LSTM), 0 outside training."""
        if self._regularization is None:
            return self.embed_tokens.weight.new_zeros(())
        return self._regularization

    def max_positions(self):
        return int(1e6)  # an LSTM has no position limit; the task's --tokens-per-sample sets the blocks


@register_model("head_awd_lstm_lm")
class HeadAWDLSTMLanguageModel(FairseqLanguageModel):
    """AWD-LSTM language model (MoS settings) with a softmax-heads output head."""

    @staticmethod
    def add_args(parser):
        parser.add_argument("--emsize", type=int, metavar="N", help="embedding size (tied output embedding)")
        parser.add_argument("--nhid", type=int, metavar="N", help="units of the LSTM layers but the last")
        parser.add_argument("--nhidlast", type=int, metavar="N", help="units of the last LSTM layer (head input)")
        parser.add_argument("--nlayers", type=int, metavar="N", help="number of LSTM layers")
        parser.add_argument("--dropout", type=float, metavar="P", help="locked dropout on the last output")
        parser.add_argument("--dropouth", type=float, metavar="P", help="locked dropout between LSTM layers")
        parser.add_argument("--dropouti", type=float, metavar="P", help="locked dropout on the embeddings")
        parser.add_argument("--dropoute", type=float, metavar="P", help="embedding (word type) dropout")
        parser.add_argument("--wdrop", type=float, metavar="P", help="DropConnect on the hidden-to-hidden matrices")
        parser.add_argument(
            "--dropoutl",
            type=float,
            metavar="P",
            help="the head's dropout (MoS: on the contexts), unless --head-options sets it",
        )
        parser.add_argument(
            "--untie-weights",
            action="store_true",
            help="an output embedding of the head's own (the papers tie it to the input embedding; "
            "ds_softmax needs this)",
        )
        parser.add_argument("--alpha", type=float, metavar="A", help="activation regularisation (AR) weight")
        parser.add_argument("--beta", type=float, metavar="B", help="temporal activation regularisation weight")
        add_head_args(parser)

    @classmethod
    def build_model(cls, args, task):
        awd_lstm_lm(args)
        return cls(AWDLSTMDecoder(args, task.target_dictionary))


def _defaults(args, **values) -> None:
    for k, v in values.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)


@register_model_architecture("head_awd_lstm_lm", "head_awd_lstm_lm")
def awd_lstm_lm(args):
    """The MoS paper's Penn Treebank settings (zihangdai/mos README), the defaults of every preset."""
    _defaults(
        args,
        emsize=280,
        nhid=960,
        nhidlast=620,
        nlayers=3,
        dropout=0.4,
        dropouth=0.225,
        dropouti=0.4,
        dropoute=0.1,
        wdrop=0.5,
        dropoutl=0.29,
        alpha=2.0,
        beta=1.0,
        untie_weights=False,
        output_head="softmax",
        head_options="{}",
        head_start="",
    )


@register_model_architecture("head_awd_lstm_lm", "head_awd_lstm_lm_ptb")
def awd_lstm_lm_ptb(args):
    """Penn Treebank (MoS: emsize 280, nhid 960, nhidlast 620, dropouts .4/.225/.4/.1, wdrop .5, dropoutl .29;
    batch 12, bptt 70, lr 20)."""
    awd_lstm_lm(args)


@register_model_architecture("head_awd_lstm_lm", "head_awd_lstm_lm_wt2")
def awd_lstm_lm_wt2(args):
    """WikiText-2 (MoS: emsize 300, nhid 1150, nhidlast 650, dropouti .55, dropouth .2; batch 15, lr 15)."""
    _defaults(args, emsize=300, nhid=1150, nhidlast=650, dropouti=0.55, dropouth=0.2)
    awd_lstm_lm(args)


@register_model_architecture("head_awd_lstm_lm", "head_awd_lstm_lm_awd_ptb")
def awd_lstm_lm_awd_ptb(args):
    """Penn Treebank, AWD-LSTM's own sizes (salesforce/awd-lstm-lm: emsize 400, nhid 1150, 3 layers, dropouti .4,
    dropouth .25; batch 20, lr 30; 24M parameters): the model of the papers' softmax, PLIF and sigsoftmax rows."""
    _defaults(args, emsize=400, nhid=1150, nhidlast=400, dropouti=0.4, dropouth=0.25)
    awd_lstm_lm(args)


@register_model_architecture("head_awd_lstm_lm", "head_awd_lstm_lm_awd_wt2")
def awd_lstm_lm_awd_wt2(args):
    """WikiText-2, AWD-LSTM's own sizes (emsize 400, nhid 1150, 3 layers, dropouti .65, dropouth .2; batch 80,
    lr 30; 33M parameters)."""
    _defaults(args, emsize=400, nhid=1150, nhidlast=400, dropouti=0.65, dropouth=0.2)
    awd_lstm_lm(args)


@register_model_architecture("head_awd_lstm_lm", "head_awd_lstm_lm_1b")
def awd_lstm_lm_1b(args):
    """One Billion Word (100k lower-cased words), the MoS paper's Table 3 / Mixtape's Table 4 setting as far as it
    is published: the MoS paper gives the parameter counts (softmax 119M, MoS 113M), not every size. Two LSTM
    layers of 1024 units on a tied 1024-d embedding give the softmax model 119.3M parameters; the light
    regularisation (dropouts .1, no word dropout, no weight drop) is our assumption for a corpus this large."""
    _defaults(
        args,
        emsize=1024,
        nhid=1024,
        nhidlast=1024,
        nlayers=2,
        dropout=0.1,
        dropouth=0.1,
        dropouti=0.1,
        dropoute=0.0,
        wdrop=0.0,
        dropoutl=0.1,
    )
    awd_lstm_lm(args)
