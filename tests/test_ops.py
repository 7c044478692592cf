"""The lean engine's ops (hf_heads/core/ops), one by one, each forward / backward pair against autograd on the
obviously correct formula in float64; and ``head.loss(impl=...)``, which says which path runs."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

import hf_heads
from hf_heads.core import lean, ops

F64 = dict(rtol=1e-10, atol=1e-10)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _leaf(*shape, g, scale=1.0):
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).requires_grad_(True)


def _reference_rows(w, b, x, target, log_prior=None, f=None, prefix=None, prefix_ids=None, label_smoothing=0.0):
    """The formula of ``ops.softmax_rows`` with autograd: per-token ``(loss, nll)``."""
    n, k, _ = x.shape
    logits = x @ w.t() if b is None else x @ w.t() + b
    if prefix is not None and prefix_ids is None:
        logits = torch.cat([prefix[:, None].expand(n, k, -1), logits[..., prefix.shape[1] :]], dim=-1)
    if prefix_ids is not None:
        logits = logits.index_copy(2, prefix_ids, prefix[:, None].expand(n, k, -1))
    logp = torch.log_softmax(logits if f is None else f(logits), dim=-1)
    logp_t = logp.gather(2, target[:, None, None].expand(n, k, 1)).squeeze(2)
    if log_prior is None:
        nll = -logp_t[:, 0]
        vocab = w.shape[0]
        return (1 - label_smoothing) * nll - label_smoothing / vocab * logp[:, 0].sum(-1), nll
    nll = -torch.logsumexp(logp_t + log_prior, dim=1)
    return nll, nll


CASES = {
    "softmax": {},
    "no bias": {"bias": False},
    "label smoothing": {"label_smoothing": 0.1},
    "mixture K=3": {"k": 3, "log_prior": True},
    "mixture K=2 with PLIF's map": {"k": 2, "log_prior": True, "f": "plif"},
    "sigsoftmax map": {"f": "sigsoftmax"},
    "plif map": {"f": "plif"},
    "prefix": {"prefix": 5},
    "prefix ids": {"prefix": 4, "prefix_ids": True},
}


def _transform(kind, slopes, slope_grads):
    """``(f, transform)``: the elementwise map for the reference and the ``(scores, back)`` form for the op."""
    if kind == "sigsoftmax":
        return ops.sigsoftmax_scores, lambda z: (ops.sigsoftmax_scores(z), lambda gr: ops.sigsoftmax_backward(z, gr))
    if kind == "plif":

        def transform(z):
            out, saved = ops.plif_forward(z, slopes.detach(), 2.0)

            def back(gr):
                grad_z, grad_slopes = ops.plif_backward(saved, gr)
                slope_grads.append(grad_slopes)
                return grad_z

            return out, back

        return (lambda z: ops.piecewise_linear_increasing_reference(z, slopes, 2.0)), transform
    return None, None


@pytest.mark.parametrize("case", list(CASES))
def test_softmax_rows_equals_autograd_in_float64(case):
    """Loss, NLL and the gradients of x, W, b, the log-priors, the prefix and PLIF's slopes against autograd."""
    c = CASES[case]
    g = _gen(0)
    n, k, d, vocab = 6, c.get("k", 1), 5, 13
    w, b, x = _leaf(vocab, d, g=g), _leaf(vocab, g=g) if c.get("bias", True) else None, _leaf(n, k, d, g=g)
    target = torch.randint(vocab, (n,), generator=g)
    log_prior = torch.log_softmax(_leaf(n, k, g=g), -1).detach().requires_grad_(True) if c.get("log_prior") else None
    prefix = _leaf(n, c["prefix"], g=g) if c.get("prefix") else None
    prefix_ids = torch.tensor([7, 0, 11, 3]) if c.get("prefix_ids") else None
    slopes = (torch.rand(8, generator=g, dtype=torch.float64) + 0.5).requires_grad_(True)
    slope_grads = []
    f, transform = _transform(c.get("f"), slopes, slope_grads)
    smoothing = c.get("label_smoothing", 0.0)

    ref_loss, ref_nll = _reference_rows(w, b, x, target, log_prior, f, prefix, prefix_ids, smoothing)
    wanted = {"x": x, "w": w, "b": b, "log_prior": log_prior, "prefix": prefix}
    wanted["slopes"] = slopes if c.get("f") == "plif" else None
    wanted = {name: t for name, t in wanted.items() if t is not None}
    ref_grads = dict(zip(wanted, torch.autograd.grad(ref_loss.sum(), list(wanted.values()))))

    grad_w, grad_b = torch.zeros_like(w), None if b is None else torch.zeros_like(b)
    with torch.no_grad():
        loss, nll, grad_x, grad_prior, grad_prefix = ops.softmax_rows(
            w.detach(),
            None if b is None else b.detach(),
            x.detach(),
            target,
            grad_weight=grad_w,
            grad_bias=grad_b,
            log_prior=None if log_prior is None else log_prior.detach(),
            transform=transform,
            prefix=None if prefix is None else prefix.detach(),
            prefix_ids=prefix_ids,
            label_smoothing=smoothing,
        )
    torch.testing.assert_close(loss, ref_loss.detach(), **F64)
    torch.testing.assert_close(nll, ref_nll.detach(), **F64)
    got = {"x": grad_x, "w": grad_w, "b": grad_b, "log_prior": grad_prior, "prefix": grad_prefix}
    got["slopes"] = sum(slope_grads) if slope_grads else None
    for name, ref in ref_grads.items():
        torch.testing.assert_close(got[name], ref, **F64, msg=lambda m: f"{case}, gradient of {name}: {m}")


def test_softmax_rows_adds_to_the_accumulators_it_is_given_only():
    """No accumulator: no weight gradient made; an accumulator holding a value gets the gradient added to it."""
    g = _gen(1)
    w, b, x = _leaf(9, 4, g=g).detach(), _leaf(9, g=g).detach(), _leaf(3, 1, 4, g=g).detach()
    target = torch.tensor([1, 8, 0])
    loss, _, _, grad_prior, grad_prefix = ops.softmax_rows(w, b, x, target)
    assert grad_prior is None and grad_prefix is None and loss.shape == (3,)
    grad_w, alone = torch.ones_like(w), torch.zeros_like(w)
    ops.softmax_rows(w, b, x, target, grad_weight=grad_w)
    ops.softmax_rows(w, b, x, target, grad_weight=alone)
    assert alone.abs().sum() > 0
    torch.testing.assert_close(grad_w, alone + 1, **F64)


def test_softmax_rows_refuses_label_smoothing_of_a_mixture():
    x = torch.zeros(2, 2, 3, dtype=torch.float64)
    prior = torch.zeros(2, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="label smoothing of a mixture"):
        ops.softmax_rows(torch.zeros(5, 3, dtype=torch.float64), None, x, torch.tensor([0, 1]), log_prior=prior,
                         label_smoothing=0.1)  # fmt: skip


@pytest.mark.parametrize("k", [2, 4, 8])
def test_sigmoid_tree_mix_equals_autograd_on_the_log_space_tree(k):
    """``z = sum_k pi_k v_k`` with pi from :func:`sigmoid_tree_log_priors` (itself checked against the paper's K = 4
    formula in test_errors_and_math.py); the values' and the gate logits' gradients against autograd."""
    g = _gen(k)
    n, s = 5, 7
    values, gates = _leaf(n, k, s, g=g), _leaf(n, k - 1, s, g=g, scale=2.0)
    ref = (ops.sigmoid_tree_log_priors(gates.transpose(1, 2)).exp() * values.transpose(1, 2)).sum(-1)
    grad_z = torch.randn(n, s, generator=g, dtype=torch.float64)
    ref_values, ref_gates = torch.autograd.grad(ref, (values, gates), grad_z)
    with torch.no_grad():
        z, saved = ops.sigmoid_tree_mix(values.clone(), gates.clone())
        grad_values, grad_gates = ops.sigmoid_tree_mix_backward(saved, grad_z.clone())
    torch.testing.assert_close(z, ref.detach(), **F64)
    torch.testing.assert_close(grad_values, ref_values, **F64)
    torch.testing.assert_close(grad_gates, ref_gates, **F64)


def test_sigmoid_tree_mix_names_a_gate_count_that_is_not_a_tree():
    with pytest.raises(ValueError, match="3 values need 2 gates and a power of two"):
        ops.sigmoid_tree_mix(torch.zeros(1, 3, 2), torch.zeros(1, 2, 2))
    with pytest.raises(ValueError, match="4 values need 3 gates"):
        ops.sigmoid_tree_mix(torch.zeros(1, 4, 2), torch.zeros(1, 2, 2))


def test_plif_forward_backward_equals_autograd_on_the_reference():
    """f(z) and the gradients of z and of the slopes against the O(T) reference, z inside and outside [-R, R]."""
    g = _gen(3)
    z = _leaf(40, g=g, scale=3.0)  # R = 2: some below -R, some above R
    assert (z < -2).any() and (z > 2).any()
    slopes = (torch.rand(9, generator=g, dtype=torch.float64) + 0.2).requires_grad_(True)
    ref = ops.piecewise_linear_increasing_reference(z, slopes, 2.0)
    grad_out = torch.randn(40, generator=g, dtype=torch.float64)
    ref_z, ref_slopes = torch.autograd.grad(ref, (z, slopes), grad_out)
    with torch.no_grad():
        out, saved = ops.plif_forward(z, slopes, 2.0)
        grad_z, grad_slopes = ops.plif_backward(saved, grad_out.clone())
        _, no_slopes = ops.plif_backward(ops.plif_forward(z, slopes, 2.0)[1], grad_out.clone(), slopes_grad=False)
    torch.testing.assert_close(out, ref.detach(), **F64)
    torch.testing.assert_close(grad_z, ref_z, **F64)
    torch.testing.assert_close(grad_slopes, ref_slopes, **F64)
    assert no_slopes is None


def test_sigsoftmax_backward_equals_autograd():
    g = _gen(4)
    z = _leaf(6, 11, g=g, scale=4.0)
    ref = z + F.logsigmoid(z)
    grad = torch.randn(6, 11, generator=g, dtype=torch.float64)
    (ref_z,) = torch.autograd.grad(ref, z, grad)
    torch.testing.assert_close(ops.sigsoftmax_scores(z.detach()), ref.detach(), **F64)
    torch.testing.assert_close(ops.sigsoftmax_backward(z.detach().clone(), grad.clone()), ref_z, **F64)


@pytest.mark.parametrize("scale, softcap", [(1.0, None), (0.0625, None), (1.0, 30.0), (1.7, 2.5)])
def test_logit_map_forward_backward_equals_autograd(scale, softcap):
    """The fixed scale / soft-cap of the logits: ``c tanh(s z / c)`` written out, its autograd gradient, and the
    lean loss's in-place pair (``back`` None for the identity); logits far past the cap saturate at +-c."""
    g = _gen(5)
    z = _leaf(6, 11, g=g, scale=20.0)
    ref = scale * z if softcap is None else softcap * torch.tanh(scale * z / softcap)
    grad = torch.randn(6, 11, generator=g, dtype=torch.float64)
    (ref_z,) = torch.autograd.grad(ref, z, grad)
    torch.testing.assert_close(ops.logit_map(z.detach(), scale, softcap), ref.detach(), **F64)
    mapped, back = ops.logit_map_forward(z.detach().clone(), scale, softcap)
    torch.testing.assert_close(mapped, ref.detach(), **F64)
    if (scale, softcap) == (1.0, None):
        assert back is None
    else:
        torch.testing.assert_close(back(grad.clone()), ref_z, **F64)
    if softcap is not None:
        assert 0.9 * softcap < mapped.abs().max() <= softcap


def test_logit_map_composes_with_a_transform_after_it():
    """``f(m(z))`` (PLIF's f, sigsoftmax's map after the cap): chain_backs runs f's backward, then m's."""
    g = _gen(6)
    z = _leaf(4, 9, g=g, scale=3.0)
    ref = ops.sigsoftmax_scores(2.0 * torch.tanh(1.5 * z / 2.0))
    grad = torch.randn(4, 9, generator=g, dtype=torch.float64)
    (ref_z,) = torch.autograd.grad(ref, z, grad)
    mapped, back = ops.logit_map_forward(z.detach().clone(), 1.5, 2.0)
    scores = ops.sigsoftmax_scores(mapped)
    both = ops.chain_backs(lambda gr: ops.sigsoftmax_backward(mapped, gr), back)
    torch.testing.assert_close(scores, ref.detach(), **F64)
    torch.testing.assert_close(both(grad.clone()), ref_z, **F64)
    assert ops.chain_backs(None, back) is back and ops.chain_backs(back, None) is back


def test_the_chunk_engine_knows_no_head():
    """lean.py holds the chunk loop: its functions take tensors, numbers and a chunk function, not a head."""
    for name, fn in inspect.getmembers(lean, inspect.isfunction):
        if fn.__module__ == lean.__name__:
            assert "head" not in inspect.signature(fn).parameters, name
    assert "head" not in inspect.signature(lean.ChunkedNLL.forward).parameters
    assert lean.chunk_tokens(50000, 2, 1, torch.device("cpu")) == max(lean.LEAN_MIN_CHUNK, 2**23 // 100000)
    assert lean.chunk_tokens(100, 2, 4, torch.device("cpu")) == 2**23 // 200


@pytest.mark.parametrize("name", ["softmax", "mos", "mixtape", "plif", "sigsoftmax", "mos_plif"])
def test_loss_impl_lean_and_reference_give_the_same_loss_and_gradients(name):
    """``impl="lean"`` (the chunk engine) and ``impl="reference"`` (autograd on the head's math) in eval mode, where
    ``"auto"`` would take the reference: the same loss and gradients in float64, ignored positions included."""
    torch.manual_seed(5)
    options = {"mixtape": {"num_gates": 4, "frequent_fraction": 0.5}, "mos": {"num_components": 3}}.get(name, {})
    if name in ("plif", "mos_plif"):
        options = {"num_knots": 16, "knot_range": 1.0}
    head = hf_heads.build_head(name, hidden_size=6, vocab_size=17, **options).double().eval()
    head.lean_chunk_tokens = lambda: 4  # several chunks, one partial
    hidden = torch.randn(3, 5, 6, dtype=torch.float64, requires_grad=True)
    target = torch.randint(17, (3, 5))
    target[0, 0] = -100
    results = {}
    for impl in ("lean", "reference"):
        head.zero_grad()
        hidden.grad = None
        loss = head.loss(hidden, target, impl=impl)
        loss.backward()
        results[impl] = (loss.detach(), hidden.grad.clone(), [p.grad.clone() for p in head.parameters()])
    torch.testing.assert_close(results["lean"][0], results["reference"][0], **F64)
    torch.testing.assert_close(results["lean"][1], results["reference"][1], **F64)
    for a, b in zip(results["lean"][2], results["reference"][2]):
        torch.testing.assert_close(a, b, **F64)


def test_loss_impl_chooses_the_path(monkeypatch):
    """``"reference"`` in training runs no chunk; ``"lean"`` in eval runs them; ``"auto"`` follows training mode."""
    calls = []
    real = lean.loss_and_nll
    monkeypatch.setattr(lean, "loss_and_nll", lambda *a: calls.append(1) or real(*a))
    torch.manual_seed(6)
    head = hf_heads.build_head("softmax", hidden_size=4, vocab_size=9)
    hidden, target = torch.randn(5, 4, requires_grad=True), torch.randint(9, (5,))
    for mode, impl, chunked in [(True, "reference", False), (True, "auto", True), (False, "auto", False),
                                (False, "lean", True)]:  # fmt: skip
        calls.clear()
        head.train(mode).loss(hidden, target, impl=impl)
        assert bool(calls) is chunked, (mode, impl)


def test_loss_impl_errors_name_the_option_and_the_allowed_values():
    torch.manual_seed(7)
    head = hf_heads.build_head("softmax", hidden_size=4, vocab_size=9)
    hidden, target = torch.randn(5, 4), torch.randint(9, (5,))
    with pytest.raises(ValueError, match=r"impl='fast'; allowed: 'auto', 'lean', 'reference'"):
        head.loss(hidden, target, impl="fast")
    with pytest.raises(ValueError, match="impl='lean' sums over tokens: reduction 'mean' or 'sum', not 'none'"):
        head.loss(hidden, target, reduction="none", impl="lean")
    ds = hf_heads.build_head("ds_softmax", hidden_size=4, vocab_size=9)
    with pytest.raises(ValueError, match="lean_loss = False"):
        ds.loss(hidden, target, impl="lean")


def test_follow_products_take_the_parameters_or_autocasts_dtype():
    """``lean_product_dtype = "follow"``: bf16 products for bf16 parameters, and for float32 ones under bf16 autocast
    (the same loss as asking for bf16 outright), float32 otherwise (the same as the default)."""
    torch.manual_seed(0)
    head = hf_heads.build_head("mos", hidden_size=8, vocab_size=300, num_components=2).train()
    hidden = torch.randn(40, 8, requires_grad=True)
    target = torch.randint(0, 300, (40,))

    def loss(products, autocast=False):
        head.lean_product_dtype = products
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return head.loss(hidden, target)

    assert torch.equal(loss("follow"), loss(None)) and head.lean_products() is None
    follow_autocast = loss("follow", autocast=True)
    assert head.lean_products() == torch.bfloat16
    assert torch.equal(follow_autocast, loss(torch.bfloat16, autocast=True))
    assert not torch.equal(follow_autocast, loss(None, autocast=True))
    head.to(torch.bfloat16)
    head.lean_product_dtype = "follow"
    assert head.lean_products() == torch.bfloat16
