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
        reason="triton was imported without TRITON_INTERPRET=1 (conftest.py sets it for the CPU tier)",
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
    tol = dict(rtol=1e-5, atol=1e-6)  # (float32 both, sums in other orders)
    _close(_run(head, hidden, target, "auto", 0.0, "mean"), _run(head, hidden, target, "lean", 0.0, "mean"), tol)


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


@pytest.mark.parametrize("k", [2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_sigmoid_tree_kernels_equal_the_log_space_tree(k, dtype):
    """Mixtape's frequent ids: ``tree_mix`` against the priors of ``sigmoid_tree_log_priors`` (the paper's eq. 3 in
    log space) in float64, and its backward (in place, the priors recomputed) against autograd through them."""
    from hf_heads.core import ops

    g = torch.Generator().manual_seed(k)
    n, s = 3, 37  # S not a multiple of the block
    comp, gates = torch.randn(n, k, s, generator=g, dtype=torch.float64), torch.randn(n, k - 1, s, generator=g).double()
    shared, gate_bias = torch.randn(n, k - 1, generator=g).double(), torch.randn(s, k - 1, generator=g).double()
    bias, grad_z = torch.randn(s, generator=g).double(), torch.randn(n, s, generator=g).double()
    comp, gates = comp.to(dtype).double().requires_grad_(), gates.to(dtype).double().requires_grad_()
    priors = ops.sigmoid_tree_log_priors((gates + shared[:, :, None] + gate_bias.t()).transpose(1, 2)).exp()
    z = (priors * comp.transpose(1, 2)).sum(-1) + bias
    grad_comp, grad_gates = torch.autograd.grad(z, [comp, gates], grad_z)
    c, gl = comp.detach().to(dtype), gates.detach().to(dtype)
    got = triton_rows.tree_mix(c, gl, shared.float(), gate_bias.float(), bias.float())
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=2e-2)  # bf16: the store
    torch.testing.assert_close(got.double(), z.detach(), **tol)
    got_comp, got_gates = triton_rows.tree_mix_backward(c, gl, shared.float(), gate_bias.float(), grad_z.float())
    assert got_comp.data_ptr() == c.data_ptr() and got_gates.data_ptr() == gl.data_ptr()  # in place
    torch.testing.assert_close(got_comp.double(), grad_comp, **tol)
    torch.testing.assert_close(got_gates.double(), grad_gates, **tol)


def _mixtape():
    torch.manual_seed(0)
    head = hf_heads.build_head("mixtape", hidden_size=HIDDEN, vocab_size=VOCAB, num_gates=4, gate_noise=0.0)
    head.lean_chunk_tokens = lambda: 4
    return head.train()


def test_the_kernels_run_under_torch_compile_and_gradient_checkpointing():
    """Compiled (dynamo breaks the graph around the lean loss, which runs eagerly: its kernels too) and with the
    hidden states from a checkpointed layer: the loss and gradients of the eager kernels."""
    from torch.utils.checkpoint import checkpoint

    hidden, target = _batch(7)
    head = _mixtape()
    layer = torch.nn.Linear(HIDDEN, HIDDEN)

    def loss_of(x, checkpointed=False):
        h = checkpoint(layer, x, use_reentrant=False) if checkpointed else layer(x)
        return head.loss(h, target, impl="triton")

    def grads(fn):
        head.zero_grad(set_to_none=True)
        layer.zero_grad(set_to_none=True)
        x = hidden.clone().requires_grad_()
        loss = fn(x)
        loss.backward()
        return [loss.detach(), x.grad, layer.weight.grad, head.gate_embedding.grad, head.weight.grad]

    torch._dynamo.reset()
    expected = grads(loss_of)
    for got in (grads(torch.compile(loss_of, backend="aot_eager")), grads(lambda x: loss_of(x, checkpointed=True))):
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_fp16_keeps_the_gradients_of_the_summed_loss_until_the_end():
    """fp16 parameters, many tokens and a GradScaler's scale: the kernels' in-place gradient is that of the summed
    loss (float32, the 1 / N of "mean" applied after, with the scale), so nothing underflows on the way: every
    gradient is the float64 reference's."""
    g = torch.Generator().manual_seed(8)
    hidden = torch.randn(512, HIDDEN, generator=g)
    target = torch.randint(0, VOCAB, (512,), generator=g)
    torch.manual_seed(0)
    head = hf_heads.build_head("mos", hidden_size=HIDDEN, vocab_size=VOCAB, num_components=2).half().train()
    reference = copy.deepcopy(head).double()
    scale = 2.0**16
    h = hidden.half().requires_grad_()
    (head.loss(h, target, impl="triton") * scale).backward()
    r = hidden.double().requires_grad_()
    reference.loss(r, target, impl="reference").backward()
    torch.testing.assert_close(h.grad.double() / scale, r.grad, rtol=2e-2, atol=1e-6)
    for (name, p), q in zip(head.named_parameters(), reference.parameters()):
        assert p.grad.abs().min() > 0 or q.grad.abs().min() == 0, name
        torch.testing.assert_close(p.grad.double() / scale, q.grad, rtol=2e-2, atol=1e-6, msg=name)


def test_an_hf_model_trains_through_the_kernels(monkeypatch):
    """The HF adapter's lean training loss (``impl="auto"``) with ``lean_kernel = "triton"`` on the swapped head:
    both kernels run (the rows' and Mixtape's tree), with the loss and every gradient of the PyTorch lean loss."""
    transformers = pytest.importorskip("transformers", reason="transformers not installed: run `make install`")
    calls = []
    for name in ("row_stats", "tree_mix"):
        original = getattr(triton_rows, name)
        monkeypatch.setattr(triton_rows, name, lambda *a, f=original, n=name, **k: calls.append(n) or f(*a, **k))
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16)
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    model = hf_heads.swap_head(transformers.GPT2LMHeadModel(config), "mixtape", num_gates=4, gate_noise=0.0).train()
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))
    results = []
    for kernel in (None, "triton"):
        hf_heads.output_head(model).lean_kernel = kernel
        model.zero_grad(set_to_none=True)
        loss = model(ids, labels=ids).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
        assert bool(calls) == (kernel is not None)
    assert set(calls) == {"row_stats", "tree_mix"}
    (lean_loss, lean_grads), (loss, grads) = results
    torch.testing.assert_close(loss, lean_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == lean_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, lean_grads[name], rtol=1e-4, atol=1e-6, msg=name)
