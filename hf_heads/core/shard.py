"""A head's slice of the vocabulary under tensor parallelism, and the operations that cross slices.

Under tensor parallelism each rank holds a contiguous slice of the output projection's rows: ``weight`` and ``bias``
are DTensors placed ``Shard(0)`` on a 1-D mesh, split as torch splits them (``ceil(V / P)`` rows per rank, the last
ranks shorter or empty). Everything else of the head is replicated. Every rank computes the same loss, as Megatron's
vocab-parallel cross-entropy does, and autograd on each rank follows one rule:

* a replicated value that meets the slice's math goes through :func:`enter` (identity; its backward sums the ranks'
  partial gradients);
* a value of the slice leaves it through :func:`total`, :func:`logsumexp` or :func:`full` (their backward hands
  each rank the gradient of its own part).

So every replicated gradient comes out whole and equal on every rank, and every slice's gradient is its own rows'.
Without a shard (``None``) every operation here is the plain torch one, so a head written with them runs unchanged
in one process. :func:`local_parameters` hands a head's code plain tensors for its DTensor parameters, and
:class:`VocabParallel` is the ``torch.distributed.tensor.parallel`` style that splits a bare head.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class VocabShard:
    """This rank's ids ``[start, stop)`` of ``vocab_size``, and the process group of the ranks that split them."""

    group: Any
    rank: int
    world: int
    start: int
    stop: int
    vocab_size: int

    @property
    def width(self) -> int:
        return self.stop - self.start

    @property
    def chunk(self) -> int:
        """Rows per rank before the last ones run short: ``ceil(V / P)``."""
        return _rows_per_rank(self.vocab_size, self.world)

    @staticmethod
    def of(weight: torch.Tensor) -> Optional["VocabShard"]:
        """The slice that ``weight`` holds when it is a DTensor placed ``Shard(0)`` on a 1-D mesh; None otherwise."""
        if not is_dtensor(weight) or weight.device_mesh.ndim != 1 or not weight.placements[0].is_shard(0):
            return None
        mesh, vocab_size = weight.device_mesh, weight.shape[0]
        rank, world = mesh.get_local_rank(), mesh.size()
        chunk = _rows_per_rank(vocab_size, world)
        start = min(rank * chunk, vocab_size)
        return VocabShard(mesh.get_group(), rank, world, start, min(start + chunk, vocab_size), vocab_size)


def _rows_per_rank(vocab_size: int, world: int) -> int:
    """``ceil(V / P)``: the rows of each rank's slice, as torch's ``Shard(0)`` splits them (the last ones shorter)."""
    return -(-vocab_size // world)


#: the parameters a head splits over the ranks (its output projection's rows); everything else stays whole
SPLIT = ("weight", "bias")


def is_dtensor(t: Any) -> bool:
    """Whether ``t`` is a DTensor (without importing torch.distributed.tensor where it is not loaded)."""
    return type(t).__name__ == "DTensor" and hasattr(t, "placements")


class _Enter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        import torch.distributed as dist

        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _Total(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        import torch.distributed as dist

        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Gather(torch.autograd.Function):
    """Every rank's equal-width ``x`` (last dimension), concatenated in rank order; backward: this rank's part."""

    @staticmethod
    def forward(ctx, x, shard):
        import torch.distributed as dist

        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(shard.world)]
        dist.all_gather(parts, x, group=shard.group)
        ctx.rank, ctx.width = shard.rank, x.shape[-1]
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.rank * ctx.width : (ctx.rank + 1) * ctx.width], None


def enter(x: torch.Tensor, shard: Optional[VocabShard]) -> torch.Tensor:
    """``x``, a replicated value about to meet the slice's math: its gradient is summed over the ranks."""
    return x if shard is None else _Enter.apply(x, shard.group)


def total(x: torch.Tensor, shard: Optional[VocabShard]) -> torch.Tensor:
    """``x`` summed over the ranks (each rank's part of a replicated value); backward: the gradient, to each part."""
    return x if shard is None else _Total.apply(x, shard.group)


def full(x: torch.Tensor, shard: Optional[VocabShard], fill: float = 0.0) -> torch.Tensor:
    """The whole ``[..., V]`` from each rank's ``[..., width]`` slice (only for what a call returns)."""
    if shard is None:
        return x
    padded = F.pad(x, (0, shard.chunk - shard.width), value=fill)
    return _Gather.apply(padded, shard)[..., : shard.vocab_size]


def logsumexp(s: torch.Tensor, shard: Optional[VocabShard], keepdim: bool = False) -> torch.Tensor:
    """``logsumexp`` of the scores ``s`` over the whole vocabulary (last dimension): each rank's over its slice, one
    all-gather of those, and their logsumexp (no max all-reduce; an empty slice gives -inf)."""
    if shard is None:
        return torch.logsumexp(s, dim=-1, keepdim=keepdim)
    local = torch.logsumexp(s, dim=-1, keepdim=True)
    return torch.logsumexp(_Gather.apply(local, shard), dim=-1, keepdim=keepdim)


def log_softmax(s: torch.Tensor, shard: Optional[VocabShard]) -> torch.Tensor:
    """``log_softmax`` over the whole vocabulary of the scores ``s`` (last dimension), on this rank's slice."""
    if shard is None:
        return torch.log_softmax(s, dim=-1)
    return s - enter(logsumexp(s, shard, keepdim=True), shard)  # (the whole row's logsumexp meets the slice)


def pick(x: torch.Tensor, target: torch.Tensor, shard: Optional[VocabShard]) -> torch.Tensor:
    """``x[..., target]`` per row (``x`` ``[N, V]``, ``target`` ``[N]``): on each rank the rows whose target is in its
    slice, summed over the ranks."""
    if shard is None:
        return x.gather(-1, target[:, None]).squeeze(-1)
    if not shard.width:
        return total(x.sum(-1) * 0.0, shard)  # (x is empty: the collective still runs, as on every rank)
    local = target - shard.start
    inside = (local >= 0) & (local < shard.width)
    picked = x.gather(-1, local.clamp(0, shard.width - 1)[:, None]).squeeze(-1)
    return total(torch.where(inside, picked, torch.zeros_like(picked)), shard)


def vocab_sum(x: torch.Tensor, shard: Optional[VocabShard]) -> torch.Tensor:
    """``x.sum(-1)`` over the whole vocabulary."""
    return total(x.sum(-1), shard)


def cross_entropy(s: torch.Tensor, target: torch.Tensor, shard: Optional[VocabShard]) -> torch.Tensor:
    """Per-row ``-log_softmax(s)[target]`` over the whole vocabulary (``F.cross_entropy``'s ``reduction="none"``)."""
    if shard is None:
        return F.cross_entropy(s, target, reduction="none")
    return logsumexp(s, shard) - pick(s, target, shard)


def topk(x: torch.Tensor, k: int, shard: Optional[VocabShard]) -> Tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest of ``x`` ``[N, V]`` over the whole vocabulary and their ids, best first: each rank's ``k``
    best of its slice, gathered (``P k`` per row), then the best of those."""
    if shard is None:
        return x.topk(k, dim=-1)
    kk = min(k, shard.width)
    values, ids = x.topk(kk, dim=-1)
    values = F.pad(values, (0, k - kk), value=-math.inf)
    ids = F.pad(ids + shard.start, (0, k - kk), value=0)
    all_values, all_ids = _Gather.apply(values, shard), _Gather.apply(ids, shard)
    best, where = all_values.topk(k, dim=-1)
    return best, all_ids.gather(-1, where)


@contextlib.contextmanager
def local_parameters(module: nn.Module, can_split: bool) -> Iterator[Optional[VocabShard]]:
    """Inside the block, ``module``'s DTensor parameters (its own and its submodules') are plain tensors whose
    gradients reach the DTensors: a ``Shard(0)`` ``weight`` / ``bias`` of the module is its rank's rows
    (``to_local``) where ``can_split``; anything else placed ``Shard`` is gathered whole (``full_tensor``: the module
    then computes the whole output layer on every rank); a ``Replicate`` one is its local copy. Yields the slice (None
    where nothing is split); a module without DTensor parameters is left as it is (yields None)."""
    swapped = []
    shard = VocabShard.of(module._parameters.get("weight")) if can_split else None
    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if not is_dtensor(p):
                continue
            split = shard is not None and sub is module and name in SPLIT
            whole = not split and any(pl.is_shard() for pl in p.placements)
            swapped.append((sub, name, p))
            sub._parameters[name] = p.full_tensor() if whole else p.to_local()
    try:
        yield shard
    finally:
        for sub, name, p in reversed(swapped):
            sub._parameters[name] = p


def split_parameters(module: nn.Module, mesh, src_data_rank: Optional[int] = 0) -> nn.Module:
    """``module.weight`` and ``module.bias`` (plain parameters) made DTensors placed ``Shard(0)`` on the 1-D
    ``mesh`` (:func:`split_parameter`); every other parameter stays a plain, replicated one."""
    for name in SPLIT:
        split_parameter(module, name, mesh, src_data_rank)
    return module


def split_parameter(module: nn.Module, name: str, mesh, src_data_rank: Optional[int] = 0) -> None:
    """``module``'s parameter ``name``, where it is a plain one, made a DTensor placed ``Shard(0)`` on the 1-D ``mesh``
    from rank ``src_data_rank``'s values (None: each rank's own, as a loader that reads each rank's rows wants)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    p = module._parameters.get(name)
    if p is not None and not is_dtensor(p):
        placed = distribute_tensor(p.data, mesh, [Shard(0)], src_data_rank=src_data_rank)
        module._parameters[name] = nn.Parameter(placed, requires_grad=p.requires_grad)


def _vocab_parallel_style() -> type:
    """:class:`VocabParallel`, made on first use (``torch.distributed.tensor.parallel`` takes a second to import)."""
    from torch.distributed.tensor.parallel import ParallelStyle

    class VocabParallel(ParallelStyle):
        """The ``torch.distributed.tensor.parallel`` style of a head: its output projection's rows (``weight`` and
        ``bias``) split over the 1-D mesh's ranks, everything else replicated; the head computes its loss, log-probs
        and top-k across the ranks' slices (:mod:`hf_heads.core.shard`). As torchtitan's plans::

            parallelize_module(model, tp_mesh, {"lm_head": hf_heads.VocabParallel()})

        Under FSDP2 on a 2-D mesh, apply it on the tensor-parallel mesh first, then ``fully_shard`` on the
        data-parallel one. Refused for a head that cannot split its vocabulary (the fast heads)."""

        def __init__(self, src_data_rank: Optional[int] = 0):
            super().__init__()
            self.src_data_rank = src_data_rank

        def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
            name = getattr(module, "head_name", None)
            if name is None or not hasattr(module, "vocab_parallel"):
                raise ValueError(f"VocabParallel splits a softmax-heads head; got {type(module).__name__}")
            if not module.vocab_parallel:
                raise ValueError(
                    f"{name}: VocabParallel: this head cannot split its vocabulary over tensor-parallel ranks (its "
                    f"structure is laid out over the ids); leave it out of the plan (each rank then holds it whole)"
                )
            if device_mesh.ndim != 1:
                raise ValueError(
                    f"{name}: VocabParallel needs a 1-D mesh, got {device_mesh.ndim} dimensions; pass the "
                    f"tensor-parallel one (mesh['tp'])"
                )
            return split_parameters(module, device_mesh, self.src_data_rank)

    VocabParallel.__module__, VocabParallel.__qualname__ = __name__, "VocabParallel"
    return VocabParallel


def __getattr__(name: str):
    if name == "VocabParallel":
        globals()[name] = _vocab_parallel_style()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
