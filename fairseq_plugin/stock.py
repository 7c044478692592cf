"""A head on a *stock* fairseq checkpoint: a ``transformer`` / ``transformer_lm`` trained without the plugin (the
released WMT and language-model checkpoints), whose decoder ends in a plain output projection.

Three ways in, one conversion (:func:`stock_projection` finds the projection, :func:`head_state` starts the head
from it):

* ``fairseq-train --arch head_ARCH --output-head NAME --restore-file STOCK.pt --reset-optimizer`` (or
  ``--finetune-from-model STOCK.pt``): :meth:`HeadTransformerDecoder.upgrade_state_dict_named
  <fairseq_plugin.models.HeadTransformerDecoder.upgrade_state_dict_named>`, which the restore, the hub and
  generation all pass through, replaces the checkpoint's projection keys by the head's, started from it;
* ``hf_heads.convert_head(hub.models[0], NAME)`` on a loaded stock model
  (:func:`fairseq_plugin.conversion.convert_stock_model`);
* ``python -m fairseq_plugin.convert STOCK.pt OUT.pt --output-head NAME``: a plugin checkpoint on disk, which
  ``fairseq-generate``, ``fairseq-interactive``, ``fairseq-eval-lm`` and the hub load with ``--user-dir
  fairseq_plugin`` (:func:`convert_checkpoint`).

The head takes the projection's weight (tied to the input embedding where the checkpoint tied it:
``--share-all-embeddings``, ``--share-decoder-input-output-embed``; the legacy ``embed_out`` key of untied ones
included); its other parameters start as the head's own initialisation, or at the model with ``--head-start
pretrained`` / ``start="pretrained"`` (:mod:`hf_heads.core.start`). A checkpoint whose output layer is not a plain
projection (adaptive softmax, adaptive inputs) is refused in one line.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import threading
from typing import Any, Dict, Optional

import torch

from hf_heads import get_head_class

from .options import HeadFlagError, usage_error

logger = logging.getLogger(__name__)

#: fairseq's stock models and the plugin's model mirroring each (its ``head_ARCH`` architectures)
STOCK_MODELS = {"transformer": "head_transformer", "transformer_lm": "head_transformer_lm"}

#: what fairseq's ``Trainer.load_checkpoint`` was asked while it runs in this thread (:func:`track_restores`): the
#: restore's ``reset_optimizer`` and whether its file has an optimizer state, read by the decoder's state-dict upgrade
#: when the checkpoint is a stock one
_RESTORE = threading.local()


class StockCheckpointError(HeadFlagError):
    """A stock checkpoint that cannot get a head (its output layer is not a plain projection, or its sharing does
    not match the model's); the message says why."""


def stock_projection(state_dict: Dict[str, torch.Tensor], prefix: str, tied: bool) -> Optional[torch.Tensor]:
    """The ``V x d`` output projection of a stock decoder's weights in ``state_dict`` (keys under ``prefix``, e.g.
    ``"decoder."``), or None when they hold a head (``prefix + "head."`` keys: a checkpoint the plugin wrote, loaded
    as it is; one with only some of the head's keys stays a strict error of ``load_state_dict``).

    ``tied``: whether the model that will hold the head shares its output embedding with the input embedding; a
    checkpoint that did not (its projection differs from its embedding) is refused then, as is an output layer that is
    not a plain projection (:class:`StockCheckpointError`)."""
    if any(k.startswith(prefix + "head.") for k in state_dict):
        return None
    refuse = [
        (prefix + "adaptive_softmax.", "an adaptive softmax (--adaptive-softmax-cutoff)"),
        (prefix + "embed_tokens.embeddings.", "adaptive inputs (--adaptive-input)"),
    ]
    for key_prefix, what in refuse:
        if any(k.startswith(key_prefix) for k in state_dict):
            raise StockCheckpointError(
                f"this stock checkpoint's decoder has {what}: its output layer is not a plain projection, so no head "
                f"can start from it"
            )
    embed = state_dict.get(prefix + "embed_tokens.weight")
    weight = state_dict.get(prefix + "output_projection.weight", state_dict.get(prefix + "embed_out"))
    if weight is None:
        if embed is None:
            raise StockCheckpointError(
                f"the checkpoint has neither {prefix}output_projection.weight, {prefix}embed_out nor "
                f"{prefix}embed_tokens.weight: not a fairseq transformer decoder's weights"
            )
        weight = embed  # an old tied checkpoint keeps the projection as the embedding alone
    if prefix + "output_projection.bias" in state_dict:
        raise StockCheckpointError("this stock checkpoint's output projection has a bias: not fairseq's projection")
    if tied and (embed is None or embed.shape != weight.shape or not torch.equal(embed, weight)):
        raise StockCheckpointError(
            "this stock checkpoint's output projection is not tied to its input embedding, but the model's is "
            "(--share-decoder-input-output-embed / --share-all-embeddings): leave those flags out to keep them apart"
        )
    return weight


def replace_projection(state_dict: Dict[str, torch.Tensor], prefix: str, head: Dict[str, torch.Tensor]) -> None:
    """In place: a stock decoder's projection keys under ``prefix`` out of ``state_dict``, the head's state in."""
    for key in (prefix + "output_projection.weight", prefix + "embed_out"):
        state_dict.pop(key, None)
    state_dict.update({prefix + "head." + k: v for k, v in head.items()})


@torch.no_grad()
def head_state(head, weight: torch.Tensor) -> Dict[str, torch.Tensor]:
    """The state dict of ``head`` (a freshly built head: its other parameters at their start) started from the
    projection ``weight`` (its :meth:`~hf_heads.core.interface.OutputHead.init_from_projection`); ``head`` itself
    is left as it was."""
    fresh = copy.deepcopy(head)
    fresh.init_from_projection(weight.to(dtype=next(fresh.parameters()).dtype), None)
    return fresh.state_dict()


def upgrade_stock_state(decoder, state_dict: Dict[str, torch.Tensor], name: str) -> bool:
    """In place: when ``state_dict`` holds a stock decoder's weights under ``name``, replace its projection keys by
    those of ``decoder.head`` started from the projection, and say so; returns whether it did. A training restore
    of a checkpoint with an optimizer state, without ``--reset-optimizer``, stops here, in one line (the stock
    optimizer state has no slots for the head)."""
    prefix = f"{name}." if name else ""
    tied = decoder.share_input_output_embed
    try:
        weight = stock_projection(state_dict, prefix, tied)
    except StockCheckpointError as e:
        usage_error(f"--output-head {decoder.head.head_name}: {e}")
    if weight is None:
        return False
    restore = getattr(_RESTORE, "current", None)
    if restore is not None and not restore["reset_optimizer"] and restore.get("optimizer_state", True):
        usage_error(
            f"{restore['filename']} is a stock fairseq checkpoint (no output head): add "
            f"--reset-optimizer to start the --output-head {decoder.head.head_name} run from it (its optimizer state "
            f"has no slots for the head), or use --finetune-from-model"
        )
    embed = state_dict.get(prefix + "embed_tokens.weight")
    if not tied and embed is not None and embed.shape == weight.shape and torch.equal(embed, weight):
        logger.warning(
            "this stock checkpoint ties its output projection to its input embedding, but the model does not: the "
            "head starts from a copy, trained apart (add --share-decoder-input-output-embed or --share-all-embeddings "
            "as the checkpoint had them to keep them tied)"
        )
    replace_projection(state_dict, prefix, head_state(decoder.head, weight))
    hint = "" if getattr(decoder, "_head_start", "") else "; --head-start pretrained starts it at the model"
    logger.info(
        f"a stock checkpoint: the {decoder.head.head_name} head starts from its output projection "
        f"({'tied to the input embedding' if tied else 'untied'}), its other parameters from their start{hint}"
    )
    return True


def track_restores() -> None:
    """Make fairseq's ``Trainer.load_checkpoint`` note its ``reset_optimizer`` while it runs, and whether the file it
    reads has an optimizer state (a released checkpoint often has none: fairseq then restores none, and no
    ``--reset-optimizer`` is needed), for :func:`upgrade_stock_state` (idempotent)."""
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils
    from fairseq.trainer import Trainer

    original = Trainer.load_checkpoint
    if getattr(original, "_softmax_heads_restore", False):
        return

    def noting(read):
        """``read`` (what gives the trainer the checkpoint's state: the file on rank 0, the broadcast on the other
        ranks), noting whether the state has an optimizer state."""

        @functools.wraps(read)
        def wrapped(*args, **kwargs):
            state = read(*args, **kwargs)
            restore = getattr(_RESTORE, "current", None)
            if restore is not None and isinstance(state, dict) and "model" in state:
                restore["optimizer_state"] = state.get("last_optimizer_state") is not None
            return state

        return wrapped

    @functools.wraps(original)
    def load_checkpoint(self, filename, reset_optimizer=False, *args, **kwargs):
        outer = getattr(_RESTORE, "current", None)
        _RESTORE.current = {"filename": filename, "reset_optimizer": reset_optimizer}
        try:
            return original(self, filename, reset_optimizer, *args, **kwargs)
        finally:
            _RESTORE.current = outer

    load_checkpoint._softmax_heads_restore = True
    Trainer.load_checkpoint = load_checkpoint
    checkpoint_utils.load_checkpoint_to_cpu = noting(checkpoint_utils.load_checkpoint_to_cpu)
    distributed_utils.broadcast_object = noting(distributed_utils.broadcast_object)


def head_arch(arch: str) -> str:
    """``head_ARCH`` for a stock architecture name (``StockCheckpointError`` if the plugin has none)."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    head = f"head_{arch}"
    if head not in ARCH_MODEL_NAME_REGISTRY:
        stock = sorted(a for a, m in ARCH_MODEL_NAME_REGISTRY.items() if m in STOCK_MODELS)
        raise StockCheckpointError(
            f"architecture {arch!r} is not one of the stock {' / '.join(STOCK_MODELS)} architectures the plugin "
            f"mirrors ({len(stock)} of them, e.g. {', '.join(stock[:4])})"
        )
    return head


def _config_value(model_args, key: str):
    """``key`` of a model's config (an ``argparse.Namespace``, a dict or a DictConfig), None where it has none."""
    return model_args.get(key) if isinstance(model_args, dict) else getattr(model_args, key, None)


def record_head(model_args, name: str, options: Dict[str, Any]) -> None:
    """Write the head into a model's config (an ``argparse.Namespace``, a dict or a DictConfig): the ``head_ARCH``
    architecture and the head flags (``options`` with any start resolved into them: no ``head_start`` word), so fairseq
    rebuilds the model with the head from it."""

    def get(key):
        return _config_value(model_args, key)

    def put(key, value):
        if isinstance(model_args, dict):
            model_args[key] = value
        else:
            setattr(model_args, key, value)

    arch = get("arch") or get("_name")
    if not str(arch).startswith("head_"):
        arch = head_arch(str(arch))
    with _writable(model_args):
        for key in ("arch", "_name"):  # a Namespace has both; a dataclass model's dict, only _name
            if get(key) is not None or (key == "arch" and not isinstance(model_args, dict)):
                put(key, arch)
        put("output_head", name)
        put("head_options", json.dumps(options))
        put("head_start", "")
        put("relative_positions", get("relative_positions") or 0)


def _writable(config):
    """A context in which new keys can be set on ``config`` (omegaconf's ``open_dict`` for a DictConfig)."""
    import contextlib

    from omegaconf import DictConfig, open_dict

    return open_dict(config) if isinstance(config, DictConfig) else contextlib.nullcontext()


def convert_checkpoint(
    source: str, target: str, name: str, head_options: Any = "{}", head_start: str = "", seed: int = 1
) -> Dict[str, Any]:
    """Write ``target``, a plugin checkpoint of the stock checkpoint ``source`` with the head ``name``: the model's
    config names ``head_ARCH`` and the head's options (``head_options`` JSON or a dict, with what ``head_start`` set
    resolved into them: the file rebuilds the same head whatever a later version's start would set), the weights
    hold the head started from the projection (its other parameters drawn under ``torch.manual_seed(seed)``),
    and everything else is kept as it was: the config's format (``args`` or ``cfg``), task, bpe, tokenizer and
    sharing flags, no ``user_dir`` added. The stock optimizer state is dropped (it has no slots for the head), so a
    ``--restore-file`` of ``target`` starts a fresh optimizer. Returns ``{"arch", "head", "options", "tied"}``;
    :class:`~fairseq_plugin.options.HeadFlagError` (a usage error) for a checkpoint or a flag it cannot take."""
    from .checkpoint import MARKER_KEY, SoftmaxHeadsCheckpoint
    from .options import build_decoder_head, parse_head_options

    state = torch.load(source, map_location="cpu", weights_only=True)
    if MARKER_KEY in state:
        raise StockCheckpointError(
            f"{source} is a checkpoint of the plugin's already (it has an output head): change its head with "
            f"--model-overrides or hf_heads.convert_head, not here"
        )
    cfg = state.get("cfg")
    model_args = cfg.get("model") if isinstance(cfg, dict) and cfg.get("model") is not None else state.get("args")
    if model_args is None:
        raise StockCheckpointError(f"{source} has no model config ('cfg' or 'args'): not a fairseq checkpoint")

    def flag(key):
        return _config_value(model_args, key)

    tied = bool(flag("share_decoder_input_output_embed") or flag("share_all_embeddings"))
    weights = state["model"]
    weight = stock_projection(weights, "decoder.", tied)
    if weight is None:
        raise StockCheckpointError(f"{source} holds a head's weights already (decoder.head.*): not a stock checkpoint")
    arch = head_arch(str(flag("arch") or flag("_name")))
    spec_name, options = parse_head_options(name, head_options, head_start)
    if tied and not get_head_class(spec_name).can_tie:
        raise StockCheckpointError(
            f"--output-head {spec_name} cannot share its output embedding with the input embedding, and this "
            f"checkpoint ties them (--share-decoder-input-output-embed / --share-all-embeddings)"
        )
    with torch.random.fork_rng(devices=[]):  # the head's start drawn apart: the caller's random state is kept
        torch.manual_seed(seed)
        head = build_decoder_head(spec_name, options, weight.shape[1], weight.shape[0])
    replace_projection(weights, "decoder.", head_state(head, weight))
    record_head(model_args, spec_name, options)  # the options the start resolved to, not the word
    state.pop("last_optimizer_state", None)
    torch.save({MARKER_KEY: SoftmaxHeadsCheckpoint(), **state}, target)
    return {"arch": arch, "head": spec_name, "options": options, "tied": tied}
