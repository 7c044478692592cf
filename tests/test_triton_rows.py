"""The Triton kernels of the lean loss's softmax rows (``impl="triton"``, hf_heads/core/ops/triton_rows.py), on the CPU
under Triton's interpreter (``TRITON_INTERPRET=1``): every head with kernels (softmax, sigsoftmax, PLIF, MoS,
MoS+PLIF, Mixtape; with a scale and a soft-cap too) gives the loss, the NLL and every gradient of the float64 reference
path and of the PyTorch lean loss, with ignored positions, several chunks (one partial), label smoothing, both
reductions, with and without a bias, and with bf16 parameters; the refusals name what is missing. The device tier
(tests/test_device.py) runs the same on CUDA."""

from __future__ import annotations

import copy

import pytest
import torch

import hf_heads
from hf_heads.core.ops import triton_rows
from head_cases import HEAD_CASES, HIDDEN, VOCAB, quiet

pytestmark = [
    pytest.mark.skipif(not triton_rows.triton_installed(), reason="triton is not installed (make install brings it)"),
    pytest.mark.skipif(
        not triton_rows.interpreting(),
        reason="triton was imported without TRITON_INTERPRET=1 (tests/conftest.py sets it for the CPU tier)",
    ),
]
KERNEL_CASES = [c for c in HEAD_CASES if hf_heads.get_head_class(c.name).row_kernels]


def _run(head, hidden, target, impl, smoothing, reduction):
    """``(loss, nll, grad of hidden, {parameter: grad})`` of ``head.loss_and_nll`` by ``impl``, in training mode."""
    head.zero_grad(set_to_none=True)
    h = hidden.detach().clone().requires_grad_()
    loss, nll = head.loss_and_nll(h, target, label_smoothing=smoothing, reduction=reduction, impl=impl)
    (2.5 * loss).backward()
    grads = {n: (torch.zeros_like(p) if p.grad is None else p.grad.clone()) for n, p in head.named_parameters()}
    return loss.detach(), nll.detach(), h.grad.clone(), grads


def _quiet(case):
    head = quiet(case).train()
    head.lean_chunk_tokens = lambda: 4  # several chunks, one of them partial
    return head


def _batch(seed=3):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(5, 3, HIDDEN, generator=g)
    target = torch.randint(0, VOCAB, (5, 3), generator=g)
    target[1, 1] = target[4, 0] = -100
    return hidden, target


def _close(got, expected, tol):
    loss, nll, grad_h, grads = got
    ref_loss, ref_nll, ref_h, ref_grads = expected
    torch.testing.assert_close(loss.double(), ref_loss.double(), **tol)
    torch.testing.assert_close(nll.double(), ref_nll.double(), **tol)
    torch.testing.assert_close(grad_h.double(), ref_h.double(), **tol)
    for name in ref_grads:
        torch.testing.assert_close(grads[name].double(), ref_grads[name].double(), **tol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("case", KERNEL_CASES, ids=[c.id for c in KERNEL_CASES])
@pytest.mark.parametrize("smoothing, reduction", [(0.0, "mean"), (0.2, "sum")])
def test_kernels_equal_the_float64_reference_and_the_lean_loss(case, smoothing, reduction):
    hidden, target = _batch()
    head = _quiet(case)
    got = _run(head, hidden, target, "triton", smoothing, reduction)
    # (float32 both; the kernels' 1 - tanh^2 avoids a cancellation the lean loss's has near the cap)
    _close(got, _run(head, hidden, target, "lean", smoothing, reduction), dict(rtol=1e-4, atol=1e-6))
    reference = copy.deepcopy(head).double()
    expected = _run(reference, hidden.double(), target, "reference", smoothing, reduction)
    _close(got, expected, dict(rtol=1e-4, atol=1e-5))


@pytest.mark.parametrize("name, options", [("softmax", {"use_bias": False}), ("plif", {"num_knots": 16})])
def test_kernels_without_a_bias_and_with_bf16_parameters(name, options):
    """bf16 parameters: the kernels cast each value to float32 on load, as the lean loss's float32 math does."""
    hidden, target = _batch(4)
    torch.manual_seed(0)
    head = hf_heads.build_head(name, hidden_size=HIDDEN, vocab_size=VOCAB, **options).to(torch.bfloat16).train()
    head.lean_chunk_tokens = lambda: 4
    _close(
        _run(head, hidden.bfloat16(), target, "triton", 0.1, "mean"),
        _run(head, hidden.bfloat16(), target, "lean", 0.1, "mean"),
        dict(rtol=1e-4, atol=1e-5),
    )


def test_a_head_opts_into_the_kernels_for_auto_and_the_adapters():
    """``head.lean_kernel = "triton"``: ``impl="auto"`` (what the fairseq criterion and the HF adapter call) takes the
    kernels wherever it takes the lean loss; off by default."""
    hidden, target = _batch(5)
    torch.manual_seed(0)
    head = hf_heads.build_head("mos", hidden_size=HIDDEN, vocab_size=VOCAB, num_components=2).train()
    assert head.lean_kernel is None and head._lean_path("auto", "mean", True) == "lean"
    head.lean_kernel = "triton"
    assert head._lean_path("auto", "mean", True) == "triton"
    _close(_run(head, hidden, target, "auto", 0.0, "mean"), _run(head, hidden, target, "lean", 0.0, "mean"), {})


def test_the_kernel_path_is_refused_in_one_line_where_it_cannot_run(monkeypatch):
    hidden, target = _batch(6)
    head = hf_heads.build_head("softmax", hidden_size=HIDDEN, vocab_size=VOCAB).train()
    monkeypatch.setattr(triton_rows, "interpreting", lambda: False)
    with pytest.raises(ValueError, match=r"^softmax: impl='triton': impl='triton' runs on CUDA tensors; on the CPU"):
        head.loss(hidden, target, impl="triton")
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"computes in float32; a float64 head takes impl='lean'"):
        head.double().loss(hidden.double(), target, impl="triton")
    ds = hf_heads.build_head("class_softmax", hidden_size=HIDDEN, vocab_size=VOCAB, num_classes=2).train()
    with pytest.raises(ValueError, match=r"^class_softmax: impl='triton': this head has no Triton kernels"):
        ds.loss(hidden, target, impl="triton")
    with pytest.raises(ValueError, match=r"allowed: 'auto', 'lean', 'reference', 'triton'"):
        head.loss(hidden, target, impl="fused")
    monkeypatch.setattr(triton_rows, "triton_installed", lambda: False)
    with pytest.raises(ValueError, match=r"needs the triton package, which is not installed"):
        head.float().loss(hidden, target, impl="triton")
