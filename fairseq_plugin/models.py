"""fairseq models whose decoder ends in a softmax-heads output head.

For every stock architecture ARCH of fairseq's ``transformer`` and ``transformer_lm`` models this
registers ``head_ARCH``: the same defaults, plus ``--output-head NAME`` and ``--head-options JSON``.

The decoder follows fairseq's own adaptive-softmax hook: ``output_layer`` returns the features
(hidden states) instead of logits, and ``get_normalized_probs`` asks the head for log-probs. So
``fairseq-generate`` (beam search, sampling), ``fairseq-interactive``, ``fairseq-eval-lm`` and
``fairseq-validate`` work unchanged, and any stock criterion still works through
``get_normalized_probs``; ``head_cross_entropy`` uses the head's own loss.
"""
# no `from __future__ import annotations`: fairseq reads the dataclass annotations as real types

import logging
from dataclasses import dataclass, field
from typing import Dict, Optional

import torch
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_NAME_REGISTRY, register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, TransformerDecoder, TransformerModel
from fairseq.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig

from .options import HeadArgs, HeadFlagError, add_head_args, build_decoder_head, parse_head_options, usage_error
from .relative_attention import use_relative_positions
from .stock import STOCK_MODELS, upgrade_stock_state

logger = logging.getLogger(__name__)


class HeadDecoderMixin:
    """What every decoder with a head does in fairseq (``self.head``): features out of ``output_layer``, log-probs
    from the head, and the check of fairseq's stock criteria (as fairseq's adaptive-softmax hook)."""

    def output_layer(self, features):
        """Hidden states go out as they are; the head turns them into log-probs."""
        return features

    def get_normalized_probs(self, net_output, log_probs: bool, sample: Optional[Dict] = None):
        if self.training and torch.is_grad_enabled():
            self._check_stock_criterion()
        lp = self.head(net_output[0])
        return lp if log_probs else lp.exp()

    def _check_stock_criterion(self) -> None:
        """Training through the log-probs is what fairseq's own criteria (cross_entropy,
        label_smoothed_cross_entropy) do; head_cross_entropy uses the head's loss instead. Refuse it for a head
        whose aux loss it would drop (DS-Softmax), warn once for the others (full [tokens, V] log-probs)."""
        if self.head.has_aux_loss:
            usage_error(
                f"--output-head {self.head.head_name} has an auxiliary loss that this --criterion drops; "
                f"use --criterion head_cross_entropy (with --label-smoothing for label smoothing)"
            )
        if not getattr(self, "_warned_stock_criterion", False):
            self._warned_stock_criterion = True
            logger.warning(
                f"--output-head {self.head.head_name} trained through its full log-probs by a stock "
                f"--criterion; --criterion head_cross_entropy trains with the head's memory-lean loss "
                f"(same values, no [tokens, V] tensor)"
            )

    def get_normalized_probs_scriptable(self, net_output, log_probs: bool, sample: Optional[Dict] = None):
        return self.get_normalized_probs(net_output, log_probs, sample)


class HeadTransformerDecoder(HeadDecoderMixin, TransformerDecoder):
    """A fairseq ``TransformerDecoder`` whose output projection is a softmax-heads head."""

    def __init__(self, args, dictionary, embed_tokens, head_spec, no_encoder_attn=False):
        # ``(name, options)`` from parse_head_options; read by build_output_projection, which the parent
        # constructor calls
        self._head_spec = head_spec
        self._head_start = getattr(args, "head_start", "") or ""
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)

    def build_output_projection(self, args, dictionary, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        if cfg.adaptive_softmax_cutoff is not None:
            raise HeadFlagError(
                "--output-head replaces the output layer; it cannot be combined with --adaptive-softmax-cutoff"
            )
        if cfg.base_layers:
            raise HeadFlagError(f"--base-layers={cfg.base_layers} is not supported with --output-head")
        name, options = self._head_spec
        self.output_projection = None
        self.head = build_decoder_head(
            name,
            options,
            self.output_embed_dim,
            len(dictionary),
            embed_tokens if self.share_input_output_embed else None,
        )

    def upgrade_state_dict_named(self, state_dict, name):
        """fairseq's upgrade (the restore, the hub and generation pass through it), after the weights of a stock
        checkpoint's projection become the head's, started from it
        (:func:`fairseq_plugin.stock.upgrade_stock_state`)."""
        upgrade_stock_state(self, state_dict, name)
        state_dict = super().upgrade_state_dict_named(state_dict, name)
        # the parent re-creates output_projection.weight from the tied input embedding
        state_dict.pop(f"{name}.output_projection.weight", None)
        return state_dict


def _build_with_head(build_stock_model, args, task, no_encoder_attn: bool):
    """Build the stock model, then replace its decoder by a :class:`HeadTransformerDecoder` that shares
    its input embedding. Bad head flags fail before anything is built, as a usage error."""
    relative = getattr(args, "relative_positions", 0) or 0
    try:
        if relative < 0:
            raise HeadFlagError(
                f"--relative-positions must be >= 0 (0: off; else the clipping distance k, e.g. 20), got {relative}"
            )
        spec = parse_head_options(args.output_head, args.head_options, getattr(args, "head_start", ""))
        model = build_stock_model(args, task)
        model.decoder = HeadTransformerDecoder(
            args, task.target_dictionary, model.decoder.embed_tokens, spec, no_encoder_attn=no_encoder_attn
        )
    except HeadFlagError as e:
        usage_error(str(e))
    if relative:
        use_relative_positions(
            model,
            relative,
            getattr(args, "quant_noise_pq", 0.0) or 0.0,
            getattr(args, "quant_noise_pq_block_size", 8) or 8,
        )
    return model


RELATIVE_HELP = (
    "self-attention with relative position representations (Shaw et al. 2018), clipped at this distance "
    "k (tensor2tensor's transformer_relative: 20, with --no-token-positional-embeddings); 0: off"
)


@register_model("head_transformer")
class HeadTransformerModel(TransformerModel):
    """fairseq's ``transformer`` (encoder-decoder) with a softmax-heads output head."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_head_args(parser)
        parser.add_argument("--relative-positions", type=int, default=0, metavar="K", help=RELATIVE_HELP)

    @classmethod
    def build_model(cls, args, task):
        return _build_with_head(super().build_model, args, task, getattr(args, "no_cross_attention", False))


@dataclass
class HeadTransformerLanguageModelConfig(TransformerLanguageModelConfig, HeadArgs):
    """``transformer_lm`` options plus ``--output-head``, ``--head-options`` and ``--relative-positions``."""

    relative_positions: int = field(default=0, metadata={"help": RELATIVE_HELP})


@register_model("head_transformer_lm", dataclass=HeadTransformerLanguageModelConfig)
class HeadTransformerLanguageModel(TransformerLanguageModel):
    """fairseq's ``transformer_lm`` with a softmax-heads output head."""

    @classmethod
    def build_model(cls, args, task):
        return _build_with_head(super().build_model, args, task, no_encoder_attn=True)


def _head_architecture(stock_arch: str):
    stock_fn = ARCH_CONFIG_REGISTRY[stock_arch]

    def arch(args):
        stock_fn(args)
        args.output_head = getattr(args, "output_head", "softmax")
        args.head_options = getattr(args, "head_options", "{}")
        args.head_start = getattr(args, "head_start", "")
        args.relative_positions = getattr(args, "relative_positions", 0)

    arch.__name__ = f"head_{stock_arch}"
    arch.__doc__ = f"``{stock_arch}`` with a softmax-heads output head."
    return arch


def register_head_architectures() -> list:
    """Register ``head_ARCH`` for every architecture of the stock transformer models (idempotent)."""
    added = []
    for arch, model_name in sorted(ARCH_MODEL_NAME_REGISTRY.items()):
        head_model = STOCK_MODELS.get(model_name)
        head_arch = f"head_{arch}"
        if head_model is None or head_arch in ARCH_MODEL_NAME_REGISTRY:
            continue
        register_model_architecture(head_model, head_arch)(_head_architecture(arch))
        added.append(head_arch)
    return added


HEAD_ARCHITECTURES = register_head_architectures()
