"""Generic tests over HEAD_CASES: every head, the same contract."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hf_heads
from head_cases import HEAD_CASES, HIDDEN, VOCAB, build_case, quiet, randomise

CASES = pytest.mark.parametrize("case", HEAD_CASES, ids=[c.id for c in HEAD_CASES])


def _hidden(*shape, dtype=torch.float32, seed=1, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, HIDDEN, generator=g)).to(dtype)


def test_registry_lists_every_case_head():
    names = hf_heads.available_heads()
    assert names == sorted(names)
    assert {c.name for c in HEAD_CASES} <= set(names)
    for required in ("softmax", "mos", "mixtape", "plif", "sigsoftmax", "mos_plif"):
        assert required in names


@CASES
def test_log_probs_are_normalised(case):
    head = randomise(build_case(case))
    lp = head(_hidden(3, 5))
    assert lp.shape == (3, 5, VOCAB) and lp.dtype == torch.float32
    assert torch.allclose(lp.exp().sum(-1), torch.ones(3, 5), atol=1e-5)
    assert (lp <= 1e-6).all()


@CASES
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore", [False, True])
def test_loss_equals_nll_of_log_probs(case, reduction, ignore):
    head = randomise(build_case(case, dtype=torch.float64))
    hidden = _hidden(4, 3, dtype=torch.float64)
    target = torch.randint(0, VOCAB, (4, 3), generator=torch.Generator().manual_seed(2))
    if ignore:
        target[0, 1] = target[2, 2] = -100
    expected = F.nll_loss(head(hidden).flatten(0, -2), target.flatten(), ignore_index=-100, reduction=reduction)
    got = head.loss(hidden, target, ignore_index=-100, reduction=reduction)
    if reduction == "none":
        expected = expected.view(4, 3)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@CASES
def test_loss_custom_ignore_index_and_grads_flow(case):
    head = randomise(build_case(case))
    hidden = _hidden(2, 4).requires_grad_()
    target = torch.tensor([[1, 0, 3, 0], [0, 5, 0, 0]])
    loss = head.loss(hidden, target, ignore_index=0)
    expected = F.nll_loss(head(hidden).flatten(0, -2), target.flatten(), ignore_index=0)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert hidden.grad is not None and torch.isfinite(hidden.grad).all()
    assert hidden.grad[0, 1].abs().sum() == 0  # ignored positions get no gradient
    assert hidden.grad[0, 0].abs().sum() > 0
    for name, p in head.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name


@CASES
def test_matches_slow_reference(case):
    head = randomise(build_case(case, dtype=torch.float64))
    hidden = _hidden(7, dtype=torch.float64, scale=2.0)
    got = head(hidden)
    with torch.no_grad():
        expected = torch.stack([case.reference(head, g) for g in hidden])
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


DEGENERATE = [c for c in HEAD_CASES if c.degenerate is not None]


def test_degenerate_cases_cover_the_bottleneck_breakers():
    assert {c.name for c in DEGENERATE} >= {"mos", "mixtape", "plif", "mos_plif"}


@pytest.mark.parametrize("case", DEGENERATE, ids=[c.id for c in DEGENERATE])
def test_degenerate_case_is_plain_softmax(case):
    head = randomise(build_case(case, **case.degenerate_options))
    hidden = _hidden(3, 4)
    with torch.no_grad():
        expected = case.degenerate(head, hidden)  # puts the head in its degenerate state
    torch.testing.assert_close(head(hidden), expected, rtol=1e-5, atol=1e-5)


@CASES
def test_gradcheck_float64(case):
    head = randomise(build_case(case, dtype=torch.float64))
    if case.approximate:
        head.train()  # the trainable path (dropout is 0 in the cases); eval approximates it without gradients
    hidden = _hidden(3, dtype=torch.float64).requires_grad_()
    target = torch.tensor([1, 4, VOCAB - 1])
    assert torch.autograd.gradcheck(lambda h: head(h), (hidden,), eps=1e-6, atol=1e-5)
    assert torch.autograd.gradcheck(lambda h: head.loss(h, target), (hidden,), eps=1e-6, atol=1e-5)
    # and w.r.t. the head's own parameters (one scalar check over all of them)
    params = [p for p in head.parameters()]
    loss = head.loss(hidden.detach(), target)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    with torch.no_grad():
        for p, gr in zip(params, grads):
            if gr is None:
                continue
            direction = torch.randn_like(p)
            p.add_(1e-6 * direction)
            up = head.loss(hidden.detach(), target)
            p.sub_(2e-6 * direction)
            down = head.loss(hidden.detach(), target)
            p.add_(1e-6 * direction)
            numeric = (up - down) / 2e-6
            assert torch.allclose((gr * direction).sum(), numeric, atol=1e-5, rtol=1e-4)


@CASES
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_are_finite_and_match_fp32(case, dtype):
    head = randomise(build_case(case))
    hidden = _hidden(4, 3, scale=300.0).to(dtype).requires_grad_()  # large logits
    lp = head(hidden)
    assert lp.dtype == torch.float32 and torch.isfinite(lp).all()
    # fp32 ground truth on the same (rounded) inputs: the math is done in fp32
    torch.testing.assert_close(lp, head(hidden.detach().float()), rtol=1e-5, atol=1e-4)
    target = torch.randint(0, VOCAB, (4, 3), generator=torch.Generator().manual_seed(3))
    loss = head.loss(hidden, target)
    assert torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(hidden.grad.float()).all()
    # parameters in low precision too (a model cast with .to(dtype))
    head_lp = randomise(build_case(case)).to(dtype)
    out = head_lp(hidden.detach())
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


@CASES
def test_autocast_keeps_head_math_fp32(case):
    head = randomise(build_case(case))
    hidden = _hidden(2, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp = head(hidden)
        loss = head.loss(hidden, torch.zeros(2, 3, dtype=torch.long))
    assert lp.dtype == torch.float32 and loss.dtype == torch.float32
    torch.testing.assert_close(lp, head(hidden), rtol=1e-6, atol=1e-6)


@CASES
def test_topk_agrees_with_full_log_probs(case):
    head = randomise(build_case(case))
    hidden = _hidden(2, 3)
    lp, idx = head.topk(hidden, 4)
    full = head(hidden)
    assert lp.shape == idx.shape == (2, 3, 4)
    torch.testing.assert_close(lp, full.gather(-1, idx), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lp, full.topk(4, dim=-1).values, rtol=1e-5, atol=1e-5)


@CASES
def test_save_load_round_trip(case, tmp_path):
    head = randomise(build_case(case))
    hf_heads.save_head(head, tmp_path / "head")
    loaded = hf_heads.load_head(tmp_path / "head").eval()
    assert type(loaded) is type(head)
    assert loaded.config == head.config and loaded.config.to_dict() == head.config.to_dict()
    hidden = _hidden(3, 2)
    assert torch.equal(loaded(hidden), head(hidden))


@CASES
def test_initialise_from_projection_and_tie(case):
    opts = dict(case.options)
    d = opts.pop("embedding_size", HIDDEN)
    weight = torch.randn(VOCAB, d)
    bias = torch.randn(VOCAB) if opts.get("use_bias", True) else None
    head = hf_heads.build_head(case.name, hidden_size=HIDDEN, vocab_size=VOCAB, weight=weight, bias=bias, **opts)
    assert head.config.embedding_size == d
    # heads with several copies of the output embedding (DS-Softmax's experts) start every copy from it;
    # heads with a structured one (D-Softmax's per-band blocks) keep their part of it
    kept, expected = case.kept_projection(head, weight)
    assert torch.equal(kept, expected)
    assert (head.bias is None) if bias is None else torch.equal(head.bias.detach(), bias.expand_as(head.bias))
    emb = torch.nn.Embedding(VOCAB, d)
    if not case.ties:
        with pytest.raises(ValueError, match="cannot be tied to the input embedding"):
            head.tie_weight(emb)
        return
    head.tie_weight(emb)
    assert head.weight is emb.weight
    head.loss(_hidden(2), torch.tensor([0, 1])).backward()
    assert emb.weight.grad is not None and emb.weight.grad.abs().sum() > 0


@CASES
def test_a_few_training_steps_lower_the_loss(case):
    head = build_case(case).train()
    hidden = _hidden(64, seed=5)
    target = torch.randint(0, VOCAB, (64,), generator=torch.Generator().manual_seed(6))
    opt = torch.optim.Adam(head.parameters(), lr=0.05)
    head.eval()
    start = head.loss(hidden, target).item()
    head.train()
    for _ in range(40):
        opt.zero_grad()
        (head.loss(hidden, target) + head.aux_loss()).backward()
        opt.step()
    head.eval()
    assert head.loss(hidden, target).item() < 0.8 * start


@CASES
def test_aux_loss_is_a_scalar_zero_unless_the_head_has_regularisers(case):
    head = build_case(case).train()
    head.loss(_hidden(8), torch.arange(8) % VOCAB)
    aux = head.aux_loss()
    assert aux.dim() == 0 and aux.dtype == torch.float32 and torch.isfinite(aux)
    assert (aux.item() > 0) if case.has_aux else (aux.item() == 0.0)


LEAN = [c for c in HEAD_CASES if hf_heads.get_head_class(c.name).lean_loss]  # DS-Softmax opts out


@pytest.mark.parametrize("case", LEAN, ids=[c.id for c in LEAN])
@pytest.mark.parametrize("ignore,smoothing", [(False, 0.0), (True, 0.0), (True, 0.2)])
def test_memory_lean_training_loss_equals_the_reference_path(case, ignore, smoothing):
    """Training mode: the chunked loss (gradients computed chunk by chunk in the forward) gives the same
    loss, NLL and gradients as plain autograd over the whole batch (randomness off: dropout 0, no gate
    noise), with and without label smoothing; and the reference path equals F.cross_entropy on the
    head's log-probs (with its label_smoothing)."""
    head = quiet(case, dtype=torch.float64).train()
    hidden = _hidden(5, 3, dtype=torch.float64).requires_grad_()
    target = torch.randint(0, VOCAB, (5, 3), generator=torch.Generator().manual_seed(7))
    if ignore:
        target[1, 1] = target[4, 0] = -100
    results = []
    for lean in (False, True):
        head.lean_loss = lean
        head.lean_chunk_tokens = lambda: 4  # several chunks, one of them partial
        if hidden.grad is not None:
            hidden.grad = None
        head.zero_grad(set_to_none=True)
        loss, nll = head.loss_and_nll(hidden, target, label_smoothing=smoothing)
        (2.5 * loss).backward()
        grads = {n: (torch.zeros_like(p) if p.grad is None else p.grad.clone()) for n, p in head.named_parameters()}
        results.append((loss.detach(), nll.detach(), hidden.grad.clone(), grads))
        if not lean:
            with torch.no_grad():
                expected = F.cross_entropy(head(hidden).flatten(0, 1), target.flatten(), label_smoothing=smoothing)
                torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-10)
    (ref_loss, ref_nll, ref_h, ref_p), (lean_loss, lean_nll, lean_h, lean_p) = results
    torch.testing.assert_close(lean_loss, ref_loss, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lean_nll, ref_nll, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lean_h, ref_h, rtol=1e-9, atol=1e-10)
    for n in ref_p:
        torch.testing.assert_close(lean_p[n], ref_p[n], rtol=1e-9, atol=1e-10, msg=n)


def test_memory_lean_loss_without_anything_to_differentiate_is_the_plain_nll():
    """A frozen head on detached hidden states in training mode: nothing needs a gradient, so the loss is
    the plain NLL (no chunked gradients, no error from autograd.grad on no inputs)."""
    head = build_case(HEAD_CASES[0]).train().requires_grad_(False)
    hidden, target = _hidden(6), torch.arange(6) % VOCAB
    loss = head.loss(hidden, target)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, F.nll_loss(head(hidden), target))


@pytest.mark.parametrize("name", ["ds_softmax", "svd_softmax", "adaptive_sampling", "class_softmax", "d_softmax"])
def test_a_head_that_does_not_apply_a_logit_map_refuses_one(name):
    """The fast heads' inference paths skip logits (experts, previews, sampling, classes): a fixed scale or soft-cap
    would be dropped there, so they refuse it in one line naming the option and the heads that apply one."""
    for option, value in (("logit_softcap", 30.0), ("logit_scale", 0.5)):
        with pytest.raises(ValueError, match=rf"^{name}: option {option}={value} is out of range; .*mixtape, mos") as e:
            hf_heads.build_head(name, hidden_size=HIDDEN, vocab_size=VOCAB, **{option: value})
        assert "\n" not in str(e.value)
    hf_heads.build_head(name, hidden_size=HIDDEN, vocab_size=VOCAB, logit_scale=1.0, logit_softcap=None)


@pytest.mark.parametrize("option, value", [("logit_scale", 0.0), ("logit_scale", -1.0), ("logit_softcap", 0.0)])
def test_logit_map_options_name_their_range(option, value):
    with pytest.raises(ValueError, match=rf"^softmax: option {option}={value} is out of range; allowed: a number in"):
        hf_heads.build_head("softmax", hidden_size=HIDDEN, vocab_size=VOCAB, **{option: value})


@pytest.mark.parametrize("name", ["plif", "mos_plif"])
def test_plif_warns_when_its_knots_do_not_cover_the_capped_logits(name):
    sizes = {"hidden_size": HIDDEN, "vocab_size": VOCAB, "num_knots": 8, "logit_softcap": 30.0}
    with pytest.warns(UserWarning, match=rf"^{name}: knot_range=20.0 is below logit_softcap=30.0"):
        hf_heads.build_head(name, **sizes)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hf_heads.build_head(name, knot_range=30.0, **sizes)
