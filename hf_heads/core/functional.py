"""Shared math of the heads, as plain functions (torch only).

Everything that more than one head needs lives here once: the float32 projection and products, the target
checks, the label-smoothed loss, the grouping of rows by block. The V-wide math with hand-written gradients (softmax
rows, the sigmoid tree, PLIF's piecewise-linear map) is in :mod:`hf_heads.core.ops`.
"""

from __future__ import annotations

import contextlib
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F


def autocast_off(t: torch.Tensor):
    """Context in which autocast is off on ``t``'s device, so head math stays in the dtype it is given (float32 as
    :func:`compute_dtype` chooses it, float64 for float64 inputs).

    bf16/fp16 models feed low-precision hidden states; logits of a large vocabulary overflow
    fp16 and lose ranks in bf16, so every head does its output math in float32 (or float64).
    """
    if not values_known(t):  # autocast has no meta device
        return contextlib.nullcontext()
    return torch.autocast(device_type=t.device.type, enabled=False)


_MM_OUT_DTYPE: dict = {}  # device type -> whether torch.mm takes out_dtype there


def product(a: torch.Tensor, b: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``a @ b`` (2-D) in float32. With ``dtype`` (bf16 / fp16), both operands are cast to it: on CUDA the product
    accumulates in float32 (``torch.mm(..., out_dtype=torch.float32)``, the tensor cores' mode); where torch has no
    such kernel (the CPU) the product is rounded to ``dtype`` first, then widened."""
    if dtype is None:
        return a.float() @ b.float()
    a, b = a.to(dtype), b.to(dtype)
    kind = a.device.type
    if _MM_OUT_DTYPE.get(kind, True):
        try:
            out = torch.mm(a, b, out_dtype=torch.float32)
            _MM_OUT_DTYPE[kind] = True
            return out
        except (TypeError, RuntimeError, NotImplementedError):
            _MM_OUT_DTYPE[kind] = False
    return torch.mm(a, b).float()


def values_known(t: torch.Tensor) -> bool:
    """False on the ``meta`` device (shapes without values): checks and shortcuts that read values are skipped there,
    so every head can be run on meta to find tensors made on the wrong device (tests/test_device.py)."""
    return t.device.type != "meta"


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype head math runs in for input ``t``: float64 stays float64, all else is float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def linear_full_precision(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x @ weight^T + bias`` in float32 (float64 for float64 ``x``), whatever the parameters' dtype."""
    dt = compute_dtype(x)
    with autocast_off(x):
        return F.linear(x.to(dt), weight.to(dt), None if bias is None else bias.to(dt))


def compiling() -> bool:
    """Whether torch.compile is tracing the caller (False on torch < 2.3, which has no public flag)."""
    return getattr(torch.compiler, "is_compiling", lambda: False)()


def smoothed_loss(
    nll: torch.Tensor, log_prob_sum: torch.Tensor, label_smoothing: float, vocab_size: int
) -> torch.Tensor:
    """Per-token label-smoothed loss ``(1 - e) nll - (e / V) sum_v log p_v`` (``F.cross_entropy``'s smoothing) from
    the NLL and the sum of the V log-probs."""
    return (1.0 - label_smoothing) * nll - (label_smoothing / vocab_size) * log_prob_sum


def check_target(
    head: str, target: torch.Tensor, expected_shape: Sequence[int], vocab_size: int, ignore_index: int
) -> torch.Tensor:
    """Validate a target tensor and return it flattened.

    ``target`` must be an integer tensor of shape ``expected_shape`` (the hidden states' leading
    dims) with values in ``[0, vocab_size)`` or equal to ``ignore_index``.
    """
    if not torch.is_tensor(target):
        raise ValueError(f"{head}: target must be a tensor of token ids, got {type(target).__name__}")
    if target.dtype.is_floating_point or target.dtype == torch.bool or target.is_complex():
        raise ValueError(f"{head}: target has dtype {target.dtype}; expected an integer tensor (torch.long)")
    if tuple(target.shape) != tuple(expected_shape):
        raise ValueError(
            f"{head}: target has shape {tuple(target.shape)}; expected {tuple(expected_shape)} "
            f"(the leading dims of hidden)"
        )
    t = target.reshape(-1).long()
    bad = ((t < 0) | (t >= vocab_size)) & (t != ignore_index)
    if not values_known(t):
        return t
    if compiling():
        # reading the flag in Python would break torch.compile's graph (and sync); the assert stays in the graph
        # and raises RuntimeError (it cannot name the value): the eager run gives the full message
        torch._assert_async(
            ~bad.any(),
            f"{head}: target contains ids outside [0, {vocab_size}) other than "
            f"ignore_index={ignore_index} (run eagerly to see the value)",
        )
        return t
    if bool(bad.any()):
        value = int(t[bad][0])
        raise ValueError(
            f"{head}: target contains {value}; allowed: token ids in [0, {vocab_size}) or ignore_index={ignore_index}"
        )
    return t


def group_rows(index: torch.Tensor) -> Tuple[torch.Tensor, List[Tuple[int, int, int]]]:
    """``(order, [(value, start, stop), ...])``: the positions of the integer tensor ``index`` sorted by
    value (stable), and for every value present the slice ``order[start:stop]`` of its positions.

    Heads that route each row to one of several blocks (DS-Softmax's experts, the class-based softmax's
    classes) run one matrix product per block present: ``x[order[start:stop]] @ W_value^T``.
    """
    order = torch.argsort(index, stable=True)
    counts = torch.bincount(index, minlength=1).tolist()
    groups, start = [], 0
    for value, n in enumerate(counts):
        if n:
            groups.append((value, start, start + n))
            start += n
    return order, groups
