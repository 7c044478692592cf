"""The head interface, its config base class and the registry every adapter reads.

A *head* replaces ``log_softmax(W g + b)``, the last layer of a language or translation
model. Every head maps hidden states ``g`` of shape ``[..., hidden_size]`` to normalised
log-probabilities ``[..., vocab_size]`` and offers the same small interface, so nothing
downstream (fairseq criterion, HF model wrapper, recipes, tests) special-cases a head by name:

* ``head(hidden)``           normalised log-probs, float32;
* ``head.loss(hidden, target, ignore_index=-100, reduction="mean")``  the NLL, which a
  head may compute without materialising what ``head(hidden)`` does;
* ``head.aux_loss()``        a scalar regulariser to add to the training loss (0 by default);
* ``head.topk(hidden, k)``   the k best tokens and their log-probs;
* ``head.config``            a :class:`HeadConfig` dataclass with ``to_dict()``.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Dict, Optional, Tuple, Type

import torch
from torch import nn

from . import functional, ops
from . import lean, shard
from .config import HeadConfig, check_float, check_int
from .vocabulary import VocabularyMixin


#: the methods that run a head's math from outside: on a head whose parameters are DTensors they run on plain local
#: tensors (:func:`_on_local_parameters`), their subclasses' overrides too (``OutputHead.__init_subclass__``)
_PUBLIC = ("forward", "loss_and_nll", "token_log_probs", "topk", "aux_loss")


def _on_local_parameters(method: Callable) -> Callable:
    """``method`` run with the head's DTensor parameters as plain tensors and :attr:`OutputHead.vocab_shard` set
    (:func:`hf_heads.core.shard.local_parameters`); a call made inside another runs as it is."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        if self.__dict__.get("_on_local") or functional.compiling():  # (no DTensor head under torch.compile)
            return method(self, *args, **kwargs)
        with shard.local_parameters(self, self.vocab_parallel) as vocab_shard:
            self.__dict__.update(_on_local=True, vocab_shard=vocab_shard)
            try:
                return method(self, *args, **kwargs)
            finally:
                self.__dict__.update(_on_local=False, vocab_shard=None)

    return run


class OutputHead(VocabularyMixin, nn.Module):
    """Base class of every head: holds the output embedding ``weight`` (V x d) and ``bias`` (V).

    Subclasses implement :meth:`log_probs_2d` on flattened hidden states ``[N, d1]``; the base
    class handles shapes, validation, the NLL and top-k. Heads whose output is one softmax over a
    score vector derive from :class:`SingleSoftmaxHead` instead and implement ``scores_2d``.
    """

    head_name = "head"
    config_class: Type[HeadConfig] = HeadConfig
    #: where the head comes from (shown in the docs table)
    paper = ""
    #: what the head is for: "reference" (plain softmax), "bottleneck" (more expressive than a softmax)
    #: or "fast" (cheaper inference); recipes pick their default heads by it
    purpose = "bottleneck"
    #: whether the head maps g (d1) to context vectors of size d; if not, d must equal d1
    projects_context = False
    #: whether the output embedding can be shared with an input embedding (:meth:`tie_weight`)
    can_tie = True
    #: memory-lean training loss (:mod:`hf_heads.core.lean`): token chunks whose gradients are computed in the
    #: forward pass, so no N x V (or K x N x V) activation is kept for backward. Set ``head.lean_loss = False``
    #: for plain autograd over the whole batch (the reference path). Heads whose training forward has
    #: side effects beyond its output (DS-Softmax: routing statistics for its aux loss) opt out.
    lean_loss = True
    #: dtype of the lean loss's V-wide matrix products (logits, and the gradients of the hidden states and of W):
    #: None computes them in float32 as everything else; ``torch.bfloat16`` / ``torch.float16`` casts both operands
    #: to it and keeps a float32 result (float32 accumulation on CUDA), for tensor-core speed on a GPU; the softmax
    #: and every elementwise step stay in float32 (docs/training_cost.md#on-a-gpu); ``"follow"`` takes the
    #: parameters' dtype where it is bf16 / fp16, else autocast's where the loss is called under autocast, else
    #: float32, as ``nn.Linear`` would (:meth:`lean_products`)
    lean_product_dtype: Optional[Any] = None
    #: whether the lean loss's V-wide rows can run in the Triton kernels (:mod:`hf_heads.core.ops.triton_rows`:
    #: ``loss(..., impl="triton")``), and ``"triton"`` to have ``impl="auto"`` take them wherever it takes the lean
    #: loss (the adapters call ``"auto"``); None keeps the lean loss in PyTorch (the default until a GPU run of the
    #: device tier passes with the kernels, docs/training_cost.md)
    row_kernels = False
    lean_kernel: Optional[str] = None
    #: V-wide float tensors per token alive in one chunk of the lean loss (logits and their log-softmax for
    #: one softmax); sets the chunk size, see :meth:`lean_chunk_tokens`
    lean_width = 2
    #: rows per token of the chunk's matrix products (K for a mixture of K softmaxes); the chunk's minimum
    #: ``LEAN_MIN_CHUNK`` counts rows, so MoS-15 does not hold 15 x 256 logit rows for speed it does not gain
    lean_rows = 1
    #: V-wide softmax rows per token of a lean chunk (K for MoS; one for Mixtape, whose K rows are its gates')
    lean_softmax_rows = 1
    #: whether the head's distribution is ``softmax(W g + b)`` (exactly, or approximated at inference
    #: only): such heads convert into one another with :func:`hf_heads.convert_head`
    is_linear_softmax = False
    #: whether :meth:`resize_vocab` can change the number of token ids (not for heads whose structure is laid
    #: out over the ids: class_softmax's classes, d_softmax's bands)
    resizable = True
    #: whether the head treats ids as ordered by frequency (Mixtape's own-gate ids, class_softmax's classes,
    #: d_softmax's bands): such heads keep the order in the buffer ``frequency_order`` (ids, most frequent
    #: first; ``arange(V)`` by default), set by :meth:`set_frequency_order`
    uses_frequency_order = False
    #: whether :meth:`aux_loss` is a regulariser the training loss must include (DS-Softmax), not the zero default
    has_aux_loss = False
    #: what the last inference call cost, per query, for heads that make inference cheaper (purpose "fast"):
    #: ``multiplications`` done against the ``budget`` of a full ``V d`` product, and head-specific counts (see each
    #: head's ``topk``); None until such a call, and for heads that do not count
    last_stats: Optional[Dict[str, float]] = None
    #: state-dict entries that weights saved by an earlier version lack: the head's load hook fills them, and loaders
    #: that bypass ``load_state_dict`` (transformers' ``from_pretrained``) call :meth:`init_optional_state` instead
    optional_state_keys: Tuple[str, ...] = ()
    #: the options that make the head, built from a trained projection ``W``, ``b``, start exactly as the model's
    #: ``softmax(W g + b)`` (what ``start="pretrained"`` sets, :mod:`hf_heads.core.start`); None for a head with no
    #: exact start (``pretrained_start_gap`` then says how far its nearest start is)
    pretrained_start: Optional[Dict[str, Any]] = {}
    #: how the head's start from a projection differs from the model (None start), or what "exact" leaves out
    pretrained_start_gap: str = ""
    #: whether the head applies the shared options ``logit_scale`` / ``logit_softcap`` (a fixed map of the logits before
    #: its softmaxes, :mod:`hf_heads.core.ops.logit_map`) on every path; a head that does not (the fast heads, whose
    #: inference skips logits) refuses any but the identity
    applies_logit_map = False
    #: ``{spec version: {option: the default it had then}}`` for the defaults this head changed after that version
    #: (core/config.py's SPEC_VERSION; read by :func:`~hf_heads.core.registry.versioned_options`)
    legacy_defaults: Dict[int, Dict[str, Any]] = {}
    #: set by :func:`hf_heads.fast_decoding`: a forward without gradients then returns :meth:`topk`'s log-probs at
    #: its ``decode_topk`` ids and ``-inf`` elsewhere (the head's fast path in a decoding loop); None: the full
    #: distribution
    decode_topk: Optional[int] = None
    #: whether the head's math can run on a slice of the vocabulary under tensor parallelism (:mod:`.shard`: its
    #: ``weight`` and ``bias`` placed ``Shard(0)``); a head that cannot gathers them whole on every rank
    vocab_parallel = False
    #: this rank's slice of the vocabulary during a call whose ``weight`` is split over tensor-parallel ranks, else
    #: None (set by the public methods, :func:`_on_local_parameters`)
    vocab_shard: Optional[shard.VocabShard] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in _PUBLIC:
            if name in cls.__dict__:
                setattr(cls, name, _on_local_parameters(cls.__dict__[name]))

    @classmethod
    def check_config(cls, config: HeadConfig) -> HeadConfig:
        """``config`` if this head can be built from it, else ``ValueError`` naming the option: the checks that
        need the head's class beside the config's own (which its constructor ran). Builds nothing."""
        if not cls.projects_context and config.embedding_size != config.hidden_size:
            raise ValueError(
                f"{cls.head_name}: option embedding_size={config.embedding_size!r} is out of range; allowed: "
                f"equal to hidden_size={config.hidden_size} (this head multiplies g itself with W)"
            )
        if config.has_logit_map and not cls.applies_logit_map:
            name, value = ("logit_softcap", config.logit_softcap)
            if config.logit_softcap is None:
                name, value = ("logit_scale", config.logit_scale)
            raise ValueError(
                f"{cls.head_name}: option {name}={value!r} is out of range; allowed: logit_scale=1 and "
                f"logit_softcap=None (this head does not apply a fixed map of the logits; the heads that do: "
                f"{', '.join(h.head_name for h in _logit_map_heads())})"
            )
        return config

    def __init__(self, config: HeadConfig):
        super().__init__()
        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}")
        c = self.check_config(config)
        self.config = config
        self.weight = nn.Parameter(torch.empty(c.vocab_size, c.embedding_size))
        self.bias = nn.Parameter(torch.zeros(c.vocab_size)) if c.use_bias else None
        nn.init.normal_(self.weight, std=c.embedding_size**-0.5)
        self.dropout = nn.Dropout(c.dropout)
        if self.uses_frequency_order:  # a buffer, not a config field: saved with the weights, not in config.json
            self.register_buffer("frequency_order", torch.arange(c.vocab_size))

    # -- to implement ---------------------------------------------------------------
    def log_probs_2d(self, hidden: torch.Tensor) -> torch.Tensor:
        """Normalised float32 log-probs ``[N, V]`` for hidden states ``[N, d1]``."""
        raise NotImplementedError

    def nll_2d(self, hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-token NLL ``[N]`` for valid targets (no ignore_index here); default via log-probs."""
        return -shard.pick(self.log_probs_2d(hidden), target, self.vocab_shard)

    # -- public interface -------------------------------------------------------------
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Normalised log-probabilities, shape ``[..., vocab_size]``: float32 for float32, bf16 and
        fp16 inputs (the head math runs in float32), float64 for float64 inputs. Inside
        :func:`hf_heads.fast_decoding` and without gradients: the top-k's log-probs, ``-inf`` elsewhere."""
        h = self._flat_hidden(hidden)
        with functional.autocast_off(h):
            if self.decode_topk is not None and not torch.is_grad_enabled():
                out = self._top_log_probs_2d(h, self.decode_topk)
            else:
                out = shard.full(self.log_probs_2d(h), self.vocab_shard, fill=-math.inf)
            return out.view(*hidden.shape[:-1], self.config.vocab_size)

    def _top_log_probs_2d(self, h: torch.Tensor, k: int) -> torch.Tensor:
        """:meth:`topk` of ``h`` ``[N, d1]`` spread over ``[N, V]``: its log-probs at its ids, ``-inf`` elsewhere (a
        head without a fast ``topk``: its full distribution's top ``k``)."""
        lp, idx = self.topk(h, min(k, self.config.vocab_size))
        return lp.new_full((h.shape[0], self.config.vocab_size), -math.inf).scatter_(1, idx, lp)

    def loss(
        self,
        hidden: torch.Tensor,
        target: torch.Tensor,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        impl: str = "auto",
    ) -> torch.Tensor:
        """Negative log-likelihood of ``target`` (shape ``hidden.shape[:-1]``).

        Equals ``F.nll_loss(head(hidden).flatten(0, -2), target.flatten(), ignore_index=...,
        reduction=...)``: ``"mean"`` averages over non-ignored tokens, ``"sum"`` adds them,
        ``"none"`` returns one value per position (0 at ignored positions). With ``label_smoothing`` = e
        (``F.cross_entropy``'s convention) each token's loss is ``(1 - e) nll - (e / V) sum_v log p_v``.

        ``impl`` says which path computes it, the same numbers either way: ``"reference"``, autograd on the head's
        math (:meth:`nll_2d` / :meth:`log_probs_2d`); ``"lean"``, the memory-lean loss (:mod:`hf_heads.core.lean`:
        token chunks whose gradients are made in the forward pass, no ``[tokens, V]`` activation kept; ``"mean"`` or
        ``"sum"`` only, and not for a head with ``lean_loss = False``); ``"auto"``, the lean loss when
        :meth:`lean_loss_active` (``lean_loss`` on, training mode, grad enabled), something needs a gradient and the
        reduction is not ``"none"``, else the reference.
        """
        return self.loss_and_nll(hidden, target, ignore_index, reduction, label_smoothing, impl)[0]

    def loss_and_nll(
        self,
        hidden: torch.Tensor,
        target: torch.Tensor,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        impl: str = "auto",
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(loss, nll)``: :meth:`loss` and the plain NLL with the same reduction, from one pass (what a
        trainer logs next to a label-smoothed loss). The NLL carries no gradient on the lean path."""
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"{self.head_name}: reduction={reduction!r}; allowed: 'mean', 'sum', 'none'")
        check_float(self.head_name, "label_smoothing", label_smoothing, 0.0, 1.0)
        h = self._flat_hidden(hidden)
        t = functional.check_target(self.head_name, target, hidden.shape[:-1], self.config.vocab_size, ignore_index)
        valid = t != ignore_index
        params = [p for p in self.parameters() if p.requires_grad]
        path = self._lean_path(impl, reduction, h.requires_grad or bool(params))
        if path:
            kind = h.device.type
            on = functional.values_known(h) and torch.is_autocast_enabled(kind)
            self.__dict__["_call_autocast"] = torch.get_autocast_dtype(kind) if on else None  # (lean_products)
            chunk_fn = self.lean_nll_chunk
            if self.vocab_shard is not None:  # a slice: autograd on the head's math, chunk by chunk
                chunk_fn = functools.partial(OutputHead.lean_nll_chunk, self)
            elif path == "triton":
                ops.check_can_run(f"{self.head_name}: impl='triton'", h)
                chunk_fn = functools.partial(self.lean_nll_chunk, triton=True)
            chunk = self.lean_chunk_tokens()
            loss, nll = lean.loss_and_nll(chunk_fn, h, t, valid, chunk, float(label_smoothing), params)
            return (loss, nll) if reduction == "sum" else (loss / valid.sum(), nll / valid.sum())
        with functional.autocast_off(h):
            nll = loss = h.new_zeros(t.shape)
            if functional.compiling() and not (self.has_aux_loss and self.training):
                # torch.compile: every row (ignored ones scored as id 0, then zeroed), as selecting the valid rows
                # (a data-dependent shape) would break the graph; rows are independent, so valid rows are unchanged.
                # Not for a head whose training forward keeps routing statistics (DS-Softmax): padding would count
                loss, nll = self._loss_and_nll_2d(h, t.masked_fill(~valid, 0), label_smoothing)
                same = loss is nll
                nll = nll.masked_fill(~valid, 0.0)
                loss = nll if same else loss.masked_fill(~valid, 0.0)
            elif not functional.values_known(valid):  # the meta device: shapes only, every row scored
                loss, nll = self._loss_and_nll_2d(h, t, label_smoothing)
            elif bool(valid.any()):
                loss_part, nll_part = self._loss_and_nll_2d(h[valid], t[valid], label_smoothing)
                nll = nll.masked_scatter(valid, nll_part)
                loss = nll if loss_part is nll_part else loss.masked_scatter(valid, loss_part)
        if reduction == "none":
            return loss.view(target.shape), nll.view(target.shape)
        if reduction == "sum":
            return loss.sum(), nll.sum()
        return loss.sum() / valid.sum(), nll.sum() / valid.sum()  # nan when every target is ignored, like F.nll_loss

    def _lean_path(self, impl: str, reduction: str, needs_grad: bool) -> Optional[str]:
        """Which path :meth:`loss_and_nll` with ``impl`` takes: None (the reference), ``"lean"`` or ``"triton"`` (the
        memory-lean loss, its V-wide rows by :mod:`hf_heads.core.ops.triton_rows`); see :meth:`loss`."""
        if impl == "auto":
            active = reduction != "none" and needs_grad and self.lean_loss_active()
            return (self.lean_kernel or "lean") if active else None
        if impl == "reference":
            return None
        if impl not in ("lean", "triton"):
            raise ValueError(f"{self.head_name}: impl={impl!r}; allowed: 'auto', 'lean', 'reference', 'triton'")
        if not self.lean_loss:
            raise ValueError(
                f"{self.head_name}: impl={impl!r}, but this head has lean_loss = False (its training forward keeps "
                f"state that chunks would count more than once); use impl='reference' or 'auto'"
            )
        if impl == "triton" and not self.row_kernels:
            raise ValueError(
                f"{self.head_name}: impl='triton': this head has no Triton kernels (its rows are grouped on the host); "
                f"use impl='lean'"
            )
        if reduction == "none":
            raise ValueError(f"{self.head_name}: impl={impl!r} sums over tokens: reduction 'mean' or 'sum', not 'none'")
        return impl

    def _loss_and_nll_2d(self, hidden: torch.Tensor, target: torch.Tensor, label_smoothing: float):
        """Per-token ``(loss, nll)`` for valid targets; the same tensor twice without label smoothing (then
        via :meth:`nll_2d`, which may skip the full log-probs)."""
        if not label_smoothing:
            nll = self.nll_2d(hidden, target)
            return nll, nll
        lp = self.log_probs_2d(hidden)
        nll = -shard.pick(lp, target, self.vocab_shard)
        total = shard.vocab_sum(lp, self.vocab_shard)
        return functional.smoothed_loss(nll, total, label_smoothing, self.config.vocab_size), nll

    def token_log_probs(
        self, hidden: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, temperature: float = 1.0
    ) -> torch.Tensor:
        """``log p(target)`` at every position (shape ``target.shape``, 0 where ``target == ignore_index``),
        differentiable: for losses that weight tokens themselves (TRL's). At ``temperature`` T the distribution is
        ``softmax(log p / T)``. Memory-lean in training (:meth:`lean_loss_active`): the rows go in chunks of
        :meth:`lean_chunk_tokens`, each under ``torch.utils.checkpoint``
        (:func:`hf_heads.core.lean.checkpointed_chunks`).
        A head with ``lean_loss = False`` (DS-Softmax, whose training forward records routing statistics that a
        recomputation would count twice) takes one plain pass instead."""
        check_float(self.head_name, "temperature", temperature, 0.0, math.inf, lo_open=True, hi_open=True)
        h = self._flat_hidden(hidden)
        t = functional.check_target(self.head_name, target, hidden.shape[:-1], self.config.vocab_size, ignore_index)
        valid = t != ignore_index
        with functional.autocast_off(h):
            if self.lean_loss_active():
                chunk = self.lean_chunk_tokens()
                lp = lean.checkpointed_chunks(self._target_log_probs, h[valid], t[valid], chunk, float(temperature))
            else:
                lp = self._target_log_probs(h[valid], t[valid], float(temperature))
        return h.new_zeros(t.shape).masked_scatter(valid, lp).view(target.shape)

    def _target_log_probs(self, hidden: torch.Tensor, target: torch.Tensor, temperature: float) -> torch.Tensor:
        """``log p(target)`` per row, the head's reference math; at ``temperature`` T the distribution is ``p^(1/T)``
        renormalised (``log_softmax(log p / T)``: the head's log-probs stand where a softmax's logits would)."""
        if temperature == 1.0:
            return -self.nll_2d(hidden, target)
        lp = shard.log_softmax(self.log_probs_2d(hidden) / temperature, self.vocab_shard)
        return shard.pick(lp, target, self.vocab_shard)

    def lean_loss_active(self) -> bool:
        """Whether :meth:`loss` takes the memory-lean path now: ``lean_loss`` on, training mode, grad enabled."""
        return self.lean_loss and self.training and torch.is_grad_enabled()

    def lean_chunk_tokens(self) -> int:
        """Tokens per chunk of the memory-lean training loss (:func:`hf_heads.core.lean.chunk_tokens` for this head's
        vocabulary, ``lean_width``, ``lean_rows`` and device)."""
        device = next(self.parameters()).device
        width = self.lean_width + self.lean_softmax_rows * (self.config.logit_softcap is not None)  # + the cap's tanh
        return lean.chunk_tokens(self.config.vocab_size, width, self.lean_rows, device)

    def lean_nll_chunk(
        self,
        hidden: torch.Tensor,
        target: torch.Tensor,
        grads: Dict[nn.Parameter, torch.Tensor],
        label_smoothing: float = 0.0,
    ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """One chunk of the memory-lean loss: ``(summed loss, summed NLL, gradient of the loss w.r.t. hidden)``.

        ``hidden`` ``[n, d1]`` is a leaf in the compute dtype (requiring grad or not: the gradient is then
        None); the gradient of the summed loss with respect to every parameter in ``grads`` is added to
        ``grads[param]`` (float accumulators). The loss is the NLL, label-smoothed as in :meth:`loss`. This
        default runs autograd on :meth:`nll_2d` (:meth:`log_probs_2d` with label smoothing); heads override
        it with hand-written gradients for their V-wide part (:func:`hf_heads.core.ops.softmax_rows`) and
        autograd for the rest (:func:`hf_heads.core.lean.backprop`). Tests hold every override to the reference
        path.
        """
        with torch.enable_grad():
            loss, nll = self._loss_and_nll_2d(hidden, target, label_smoothing)
            loss = loss.sum()
        return loss.detach(), nll.sum().detach(), lean.backprop([loss], [torch.ones_like(loss)], hidden, grads)

    def aux_loss(self) -> torch.Tensor:
        """Scalar regulariser to add to the training loss; 0 for heads without one."""
        return self.weight.new_zeros((), dtype=torch.float32)

    def init_optional_state(self) -> None:
        """Set the :attr:`optional_state_keys` entries from the config, as a state dict without them would (for
        loaders that bypass the head's load hook and leave missing entries uninitialised)."""

    def topk(self, hidden: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` most probable tokens: ``(log_probs, indices)``, each ``[..., k]``, best first (of the full
        distribution, :meth:`log_probs_2d`, also inside :func:`hf_heads.fast_decoding`, whose forward reads this)."""
        check_int(self.head_name, "k", k, 1, self.config.vocab_size)
        h = self._flat_hidden(hidden)
        with functional.autocast_off(h):
            top, idx = shard.topk(self.log_probs_2d(h), k, self.vocab_shard)
        shape = (*hidden.shape[:-1], k)
        return top.view(shape), idx.view(shape)

    def extra_repr(self) -> str:
        c = self.config
        return f"name={self.head_name!r}, hidden_size={c.hidden_size}, vocab_size={c.vocab_size}"

    # -- helpers ------------------------------------------------------------------------
    def _cached(self, name: str, tensors, build):
        """``build()`` under no_grad, cached until one of ``tensors`` changes (storage, in-place version,
        dtype, device): inference tables of the fast heads, rebuilt after every optimizer step."""
        key = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in tensors if t is not None)
        cache = self.__dict__.setdefault("_inference_cache", {})
        hit = cache.get(name)
        if hit is None or hit[0] != key:
            with torch.no_grad():
                hit = (key, build())
            cache[name] = hit
        return hit[1]

    def _flat_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """Validated hidden states ``[N, hidden_size]`` in the compute dtype (float32, or float64)."""
        if not torch.is_tensor(hidden) or hidden.dim() < 1 or hidden.shape[-1] != self.config.hidden_size:
            shape = tuple(hidden.shape) if torch.is_tensor(hidden) else type(hidden).__name__
            raise ValueError(
                f"{self.head_name}: hidden has shape {shape}; expected [..., hidden_size] with "
                f"hidden_size={self.config.hidden_size}"
            )
        if not hidden.is_floating_point():
            raise ValueError(f"{self.head_name}: hidden has dtype {hidden.dtype}; expected a floating-point tensor")
        return hidden.reshape(-1, self.config.hidden_size).to(functional.compute_dtype(hidden))

    def _output_grads(self, grads: Dict[nn.Parameter, torch.Tensor]) -> Dict[str, Any]:
        """:func:`hf_heads.core.ops.softmax_rows`'s keywords for the output layer's gradient accumulators in
        ``grads`` (None for a parameter not there) and the head's ``lean_product_dtype``."""
        bias = None if self.bias is None else grads.get(self.bias)
        return {"grad_weight": grads.get(self.weight), "grad_bias": bias, "product_dtype": self.lean_products()}

    def lean_products(self) -> Optional[torch.dtype]:
        """The dtype the lean loss's V-wide products take now (:attr:`lean_product_dtype`; ``"follow"``: bf16 / fp16
        parameters' dtype, else that of the autocast the current :meth:`loss` call was made under, else None)."""
        chosen = self.lean_product_dtype
        if chosen != "follow":
            return chosen
        if self.weight.dtype in (torch.bfloat16, torch.float16):
            return self.weight.dtype
        return self.__dict__.get("_call_autocast")

    def logit_map(self, logits: torch.Tensor) -> torch.Tensor:
        """The options' fixed map of the logits, ``c tanh(s z / c)`` (``s z`` without a cap; ``logits`` itself for
        the identity), under autograd."""
        c = self.config
        return ops.logit_map(logits, c.logit_scale, c.logit_softcap)

    def row_map(self, grads: Dict[nn.Parameter, torch.Tensor]) -> "ops.RowMap":
        """What the Triton kernels apply to a row of logits before its softmax (``impl="triton"``): the options'
        fixed map, then the head's elementwise f (identity here); a PLIF head's slope gradients go to ``grads``."""
        return ops.RowMap(scale=self.config.logit_scale, softcap=self.config.logit_softcap)

    def lean_logit_map(self, logits: torch.Tensor, then: Optional[Callable] = None):
        """``(then(m(logits)), back)`` for the lean loss, m the options' fixed map (made in place in ``logits``) and
        ``then`` an elementwise transform after it returning ``(scores, back)`` (PLIF's f, sigsoftmax's map; None: the
        identity): :func:`hf_heads.core.ops.softmax_rows`'s ``transform``."""
        c = self.config
        mapped, back = ops.logit_map_forward(logits, c.logit_scale, c.logit_softcap)
        scores, inner = (mapped, None) if then is None else then(mapped)
        return scores, ops.chain_backs(inner, back)

    def _output_logits(self, context: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
        """float32 ``context @ W[rows]^T + b[rows]`` (autocast off, so the math stays fp32)."""
        b = None if self.bias is None else self.bias[rows]
        return functional.linear_full_precision(shard.enter(context, self.vocab_shard), self.weight[rows], b)


class SingleSoftmaxHead(OutputHead):
    """A head whose distribution is one softmax over a score vector: ``log_softmax(s(g))``.

    The NLL is a fused cross-entropy on the scores, never a log-softmax plus gather.
    """

    def scores_2d(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 pre-softmax scores ``[N, V]``."""
        raise NotImplementedError

    def log_probs_2d(self, hidden: torch.Tensor) -> torch.Tensor:
        return shard.log_softmax(self.scores_2d(hidden), self.vocab_shard)

    def nll_2d(self, hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return shard.cross_entropy(self.scores_2d(hidden), target, self.vocab_shard)

    def topk(self, hidden: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        check_int(self.head_name, "k", k, 1, self.config.vocab_size)
        h = self._flat_hidden(hidden)
        with functional.autocast_off(h):
            s = self.scores_2d(h)
            top, idx = shard.topk(s, k, self.vocab_shard)
            lp = top - shard.logsumexp(s, self.vocab_shard, keepdim=True)
        shape = (*hidden.shape[:-1], k)
        return lp.view(shape), idx.view(shape)


class LinearScoresHead(SingleSoftmaxHead):
    """A single softmax over ``f(m(W dropout(g) + b))``, f elementwise (:meth:`score_transform`): softmax
    (identity), sigsoftmax, PLIF; m the options' fixed map (:meth:`OutputHead.logit_map`, the identity by default).
    Their memory-lean loss runs the V-wide part by hand."""

    applies_logit_map = True
    row_kernels = True
    vocab_parallel = True

    def score_transform(self, logits: torch.Tensor) -> torch.Tensor:
        """f, elementwise on the float32 logits (identity here)."""
        return logits

    def lean_score_transform(self, logits: torch.Tensor, grads: Dict[nn.Parameter, torch.Tensor]):
        """``(f(logits), back)`` for the lean loss: ``back(grad_scores) -> grad_logits`` (may work in place on
        its argument and on ``logits``), adding f's parameter gradients to ``grads``; ``back`` is None for the
        identity."""
        return logits, None

    def scores_2d(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.score_transform(self.logit_map(self._output_logits(self.dropout(hidden))))

    def lean_nll_chunk(self, hidden, target, grads, label_smoothing=0.0, triton=False):
        with torch.enable_grad():
            x = self.dropout(hidden)
        loss, nll, grad_x, _, _ = ops.softmax_rows(
            self.weight,
            self.bias,
            x.detach()[:, None],
            target,
            **self._output_grads(grads),
            transform=lambda z: self.lean_logit_map(z, lambda y: self.lean_score_transform(y, grads)),
            row_map=self.row_map(grads) if triton else None,
            label_smoothing=label_smoothing,
        )
        return loss.sum(), nll.sum(), lean.backprop([x], [grad_x[:, 0]], hidden, grads)


def _logit_map_heads() -> list:
    """The registered head classes that apply ``logit_scale`` / ``logit_softcap`` (for messages)."""
    found, todo = [], list(OutputHead.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.applies_logit_map and cls.head_name != OutputHead.head_name and cls not in found:
            found.append(cls)
    return sorted(found, key=lambda c: c.head_name)


for _name in _PUBLIC:
    setattr(OutputHead, _name, _on_local_parameters(getattr(OutputHead, _name)))
