"""Triton kernels for the V-wide middle of :func:`~hf_heads.core.ops.softmax_rows` (``impl="triton"``).

The matrix products (the logits ``x W^T + b``, then ``grad @ W`` and ``grad^T x``) stay cuBLAS products over token
chunks, as in Liger Kernel's fused linear cross-entropy; between them, one Triton program per row of the chunk's
logits buffer does the V-wide work in float32 registers, whatever the buffer's dtype (bf16 / fp16 / fp32: cast right
after each load, back on the store), in two passes over the row:

* :func:`row_stats`: the row's scores ``s = f(m(z))`` (m: the head's fixed scale / soft-cap, ``c tanh(s z / c)``;
  f: the identity, sigsoftmax's ``2y - softplus(y)`` or PLIF's piecewise-linear map, its bin's slope looked up in the
  kernel), their online max and sum of exponentials (``logsumexp``), the target's score and the sum of the scores
  (for label smoothing);
* :func:`row_grads`: the gradient of the loss with respect to the logits, written in place into the buffer:
  ``w (softmax(s) - (1 - e) onehot - e / V) f'(m(z)) m'(z)``, with ``w`` a weight per row (1; MoS: the component's
  posterior responsibility, which couples the K rows of a token only through an ``[n, K]`` matrix) and, for PLIF,
  the slope gradients as per-bin sums (``atomic_add``).

Mixtape's frequent ids have kernels of their own (:func:`tree_mix`, :func:`tree_mix_backward`): its sigmoid tree's
priors, the gated logits and their gradients, the priors recomputed in the backward (nothing saved).

Ignored positions never reach the kernels (the lean loss keeps the valid rows). The kernels themselves are in
:mod:`._row_kernels`, imported when they first run. On the CPU they run in Triton's interpreter (``TRITON_INTERPRET=1``,
set before triton is first imported, as conftest.py does: for tests, slow); where triton cannot be imported, or
the tensors are on a device it cannot run on, :func:`check_can_run` says so in one line.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch

#: what f is, per kernel (a constexpr of the kernels)
KINDS = {"identity": 0, "sigsoftmax": 1, "plif": 2}
#: values of a row each program handles at a time
BLOCK = 1024


@dataclass
class RowMap:
    """What the kernels apply to a row of logits before its softmax: the head's fixed map (``scale``, ``softcap``)
    and then f (``kind``; for PLIF its ``slopes`` [T], which may carry a graph to the head's parameters, and
    ``knot_range``)."""

    scale: float = 1.0
    softcap: Optional[float] = None
    kind: str = "identity"
    slopes: Optional[torch.Tensor] = None
    knot_range: float = 1.0
    #: called with the slopes' gradient ``[T]`` (float32) where ``slopes`` requires one
    on_slope_grads: Optional[Callable[[torch.Tensor], None]] = None

    def atomic(self) -> bool:
        """Whether the kernels add gradients atomically (PLIF's slopes), in an order that varies from run to run."""
        return self.kind == "plif" and self.slopes is not None and self.slopes.requires_grad


def interpreting() -> bool:
    """Whether Triton runs its interpreter (the kernels then run on CPU tensors): fixed when triton is imported, by
    ``TRITON_INTERPRET=1`` then (its standard functions, such as ``tl.sum``, are interpreted or compiled for good)."""
    language = sys.modules.get("triton.language")
    if language is not None:
        return type(language.sum).__name__ == "InterpretedFunction"
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_installed() -> bool:
    """Whether the triton package can be imported (it is imported only when a kernel first runs)."""
    return importlib.util.find_spec("triton") is not None


def check_can_run(where: str, tensor: torch.Tensor) -> None:
    """``ValueError`` in one line where the kernels cannot run on ``tensor``: no triton, a float64 head (the kernels
    compute in float32), a CPU tensor outside the interpreter, or another device."""
    if not triton_installed():
        raise ValueError(f"{where}: impl='triton' needs the triton package, which is not installed (make install)")
    if tensor.dtype == torch.float64:
        raise ValueError(f"{where}: impl='triton' computes in float32; a float64 head takes impl='lean'")
    if tensor.device.type == "cuda" or (tensor.device.type == "cpu" and interpreting()):
        return
    if tensor.device.type == "cpu":
        raise ValueError(
            f"{where}: impl='triton' runs on CUDA tensors; on the CPU only under Triton's interpreter "
            f"(TRITON_INTERPRET=1 before triton is imported; slow: for tests); use impl='lean'"
        )
    raise ValueError(f"{where}: impl='triton' runs on CUDA tensors, not on {tensor.device.type}; use impl='lean'")


def _map_args(row_map: RowMap, device) -> Tuple[tuple, dict]:
    """The kernels' shared arguments (positional, constexpr keywords) for ``row_map``."""
    kind = KINDS[row_map.kind]
    if kind == KINDS["plif"]:
        slopes = row_map.slopes.detach().float().contiguous()
        step = 2.0 * row_map.knot_range / slopes.shape[0]
        before = ((torch.cumsum(slopes, 0) - slopes) * step - row_map.knot_range).contiguous()
        num_knots = slopes.shape[0]
    else:
        slopes = before = torch.zeros(1, device=device)
        num_knots = 1
    cap = row_map.softcap
    args = (float(row_map.scale), 1.0 if cap is None else float(cap), before, slopes, float(row_map.knot_range))
    flags = {"HAS_SCALE": row_map.scale != 1.0, "HAS_CAP": cap is not None, "KIND": kind}
    return args + (num_knots,), flags


def row_stats(logits: torch.Tensor, target: torch.Tensor, row_map: RowMap):
    """``(lse, target_score, score_sum)``, float32 ``[R]`` each, of the rows of ``logits`` ``[R, V]`` (unit stride
    along V) for ``target`` ``[R]``: the logsumexp of the row's scores, the target's score, the sum of the scores."""
    rows, vocab = logits.shape
    out = [torch.empty(rows, dtype=torch.float32, device=logits.device) for _ in range(3)]
    if rows:
        args, flags = _map_args(row_map, logits.device)
        _kernels()._stats_kernel[(rows,)](
            logits, logits.stride(0), target, *out, vocab, *args, **flags, BLOCK_V=min(BLOCK, _pow2(vocab))
        )
    return tuple(out)


def row_grads(
    logits: torch.Tensor,
    target: torch.Tensor,
    lse: torch.Tensor,
    weight: torch.Tensor,
    row_map: RowMap,
    smoothing: float = 0.0,
) -> Optional[torch.Tensor]:
    """In place in ``logits``: the gradient of ``sum_r weight_r loss_r`` with respect to the logits (``loss_r`` the
    row's NLL, label-smoothed by ``smoothing``), given the rows' ``lse`` from :func:`row_stats`. Returns the gradient
    with respect to PLIF's slopes ``[T]`` (float32) for a PLIF map whose slopes require it, else None."""
    rows, vocab = logits.shape
    slope_grads = row_map.kind == "plif" and row_map.slopes.requires_grad
    size = row_map.slopes.shape[0] if slope_grads else 1
    per_bin, at_bin = (torch.zeros(size, dtype=torch.float32, device=logits.device) for _ in range(2))
    if rows:
        args, flags = _map_args(row_map, logits.device)
        _kernels()._grads_kernel[(rows,)](
            logits,
            logits.stride(0),
            target,
            lse,
            weight.float().contiguous(),
            per_bin,
            at_bin,
            vocab,
            float(smoothing),
            *args,
            **flags,
            SLOPE_GRADS=slope_grads,
            BLOCK_V=min(BLOCK, _pow2(vocab)),
        )
    if not slope_grads:
        return None
    above = per_bin.flip(0).cumsum(0).flip(0) - per_bin  # (the suffix sums of ops.plif_slope_grads)
    return (above + at_bin) * (2.0 * row_map.knot_range / size)


def _kernels():
    """The kernels' module (:mod:`._row_kernels`), imported on first use: importing triton costs time, and whether
    it interprets is fixed when it is imported (``TRITON_INTERPRET=1`` must be set before)."""
    from . import _row_kernels

    return _row_kernels


def _pow2(n: int) -> int:
    """The least power of two at least ``n`` (Triton's blocks are powers of two)."""
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


#: the most gates (K) :func:`tree_mix` takes: its blocks hold K values per id (more compile slowly and spill
#: registers); Mixtape with more gates keeps its sigmoid tree in PyTorch under ``impl="triton"``
TREE_MAX_GATES = 64


def tree_mix(
    comp: torch.Tensor,
    gates: torch.Tensor,
    shared: torch.Tensor,
    gate_bias: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Mixtape's gated logits of its S frequent ids in one kernel, ``z [n, S] = sum_k pi_k comp[:, k] (+ bias)``:
    the K = 2^L priors ``pi`` from the sigmoid tree of ``gates [n, K - 1, S] + shared [n, K - 1, None] +
    gate_bias.T`` (``gate_bias [S, K - 1]``), the values ``comp [n, K, S]`` (what
    :func:`~hf_heads.core.ops.sigmoid_tree_mix` computes from the summed gates, without its saved levels)."""
    n, k, s = comp.shape
    out = comp.new_empty(n, s)
    if n and s:
        _kernels()._tree_mix_kernel[(n, _cdiv(s, _tree_block(k)))](
            comp.contiguous(),
            gates.contiguous(),
            shared.float().contiguous(),
            gate_bias.contiguous(),
            out if bias is None else bias.contiguous(),
            out,
            s,
            HAS_BIAS=bias is not None,
            K=k,
            LEVELS=k.bit_length() - 1,
            BLOCK_S=_tree_block(k),
        )
    return out


def tree_mix_backward(
    comp: torch.Tensor, gates: torch.Tensor, shared: torch.Tensor, gate_bias: torch.Tensor, grad_z: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(grad_comp [n, K, S], grad_gates [n, K - 1, S])`` of ``sum(grad_z * z)`` for :func:`tree_mix`'s ``z``,
    written in place into ``comp`` and ``gates`` (contiguous; the priors recomputed from them, nothing saved)."""
    n, k, s = comp.shape
    if not (comp.is_contiguous() and gates.is_contiguous()):
        raise ValueError("tree_mix_backward: comp and gates must be contiguous (their buffers take the gradients)")
    if n and s:
        _kernels()._tree_mix_backward_kernel[(n, _cdiv(s, _tree_block(k)))](
            comp,
            gates,
            shared.float().contiguous(),
            gate_bias.contiguous(),
            grad_z.contiguous(),
            s,
            K=k,
            LEVELS=k.bit_length() - 1,
            BLOCK_S=_tree_block(k),
        )
    return comp, gates


def _tree_block(k: int) -> int:
    """Ids per program of the tree kernels: about 2048 values of each ``[K, BLOCK_S]`` block in registers."""
    return max(16, min(1024, 2048 // k))


def _cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for a launch grid."""
    return -(-a // b)
