"""class_softmax and d_softmax beyond the generic head table: the classes and bands they build, what their
loss and top-k compute, and the multiplications they report."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import hf_heads
from hf_heads.heads import frequency_binning, zipf_class_boundaries
from head_cases import randomise

D = 8


def _hidden(n, seed=1, dtype=torch.float64):
    return torch.randn(n, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _head(name, vocab_size, dtype=torch.float64, **options):
    torch.manual_seed(0)
    return randomise(hf_heads.build_head(name, hidden_size=D, vocab_size=vocab_size, **options)).to(dtype).eval()


def _spans(head):
    ends = head.config.class_boundaries
    return list(zip([0] + ends[:-1], ends))


# ----------------------------------------------------------------------------- class_softmax: the classes
def test_class_softmax_frequency_binning_gives_classes_of_equal_zipf_mass():
    vocab, num_classes = 10000, 100
    ends = zipf_class_boundaries(vocab, num_classes)
    assert len(ends) == num_classes and ends[-1] == vocab and all(a < b for a, b in zip(ends, ends[1:]))
    p = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    p /= p.sum()
    starts = [0] + ends[:-1]
    mass = torch.stack([p[s:e].sum() for s, e in zip(starts, ends)]) * num_classes  # 1 = a fair share
    sizes = torch.tensor(ends) - torch.tensor(starts)
    shared = sizes > 1
    # tokens heavier than a share (and those right after them) get a class each: a prefix of the ids
    singles = int((~shared).sum())
    assert 0 < singles < num_classes and not shared[:singles].any() and shared[singles:].all()
    assert p[0] * num_classes > 1
    # the classes of rarer tokens split the rest evenly, growing with rank
    assert mass[shared].min() > 0.9 and mass[shared].max() < 1.1
    assert (sizes[singles:].diff() >= 0).all()
    # and the head uses them by default, with C = round(sqrt(V))
    head = hf_heads.build_head("class_softmax", hidden_size=D, vocab_size=vocab)
    assert head.config.num_classes == 100 and head.config.class_boundaries == ends
    assert head.config.search_classes == 100


def test_class_softmax_frequency_binning_from_real_counts():
    assert frequency_binning(torch.ones(12), 4) == [3, 6, 9, 12]  # equal counts: equal sizes
    assert frequency_binning([100, 1, 1, 1], 2) == [1, 4]  # a heavy token alone
    assert frequency_binning([1, 1, 1], 3) == [1, 2, 3]  # one token per class at the least
    assert frequency_binning([5, 0, 0, 0, 5], 2) == [1, 5]
    with pytest.raises(ValueError, match="num_classes=4 is out of range"):
        frequency_binning([1, 2, 3], 4)
    with pytest.raises(ValueError, match="counts must be non-negative"):
        frequency_binning([1, -2, 3], 2)


def test_class_softmax_explicit_class_boundaries():
    head = hf_heads.build_head("class_softmax", hidden_size=D, vocab_size=10, class_boundaries=(3, 4, 10))
    assert head.config.num_classes == 3 and head.config.class_boundaries == [3, 4, 10]
    token_class, class_size = head.class_tables()
    assert token_class.tolist() == [0, 0, 0, 1, 2, 2, 2, 2, 2, 2] and class_size.tolist() == [3, 1, 6]
    with pytest.raises(ValueError, match=r"num_classes=2 is out of range; allowed: len\(class_boundaries\) = 3"):
        hf_heads.build_head("class_softmax", hidden_size=D, vocab_size=10, class_boundaries=[3, 4, 10], num_classes=2)


# ----------------------------------------------------------------------------- class_softmax: the loss
def test_class_softmax_loss_reads_only_the_target_classes():
    """Poison every token row outside the target classes (and the token alone in its class, whose
    p(x | c) = 1 needs no logit): the loss is unchanged, and those rows get no gradient."""
    head = _head("class_softmax", 60)
    spans = _spans(head)
    assert spans[0] == (0, 1)  # token 0 is alone in its class
    hidden = _hidden(6)
    target = torch.tensor([0, spans[3][0], spans[3][1] - 1, spans[6][0] + 1, 0, spans[3][0] + 1])
    expected = F.nll_loss(head(hidden), target, reduction="none")
    used = torch.zeros(60, dtype=torch.bool)
    for c in (3, 6):
        used[spans[c][0] : spans[c][1]] = True
    with torch.no_grad():
        head.weight[~used] = float("nan")
        head.bias[~used] = float("nan")
    got = head.loss(hidden, target, reduction="none")
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    got.sum().backward()
    assert torch.equal(head.weight.grad[~used], torch.zeros_like(head.weight.grad[~used]))
    assert torch.isfinite(head.weight.grad).all() and head.weight.grad[used].abs().sum() > 0


# ----------------------------------------------------------------------------- class_softmax: top-k
def _searched_reference(head, hidden, k):
    """Brute force: the best search_classes classes of each row (more while they hold < k tokens), then
    the top-k of the full log-probs over their tokens."""
    spans, full = _spans(head), head(hidden)
    class_lp = torch.log_softmax(hidden @ head.class_proj.weight.T + head.class_proj.bias, -1)
    values, ids, tokens, classes = [], [], [], []
    for row in range(hidden.shape[0]):
        allowed = torch.zeros(full.shape[1], dtype=torch.bool)
        taken = []
        for c in class_lp[row].argsort(descending=True).tolist():
            if len(taken) >= head.config.search_classes and int(allowed.sum()) >= k:
                break
            taken.append(c)
            allowed[spans[c][0] : spans[c][1]] = True
        top = full[row].masked_fill(~allowed, float("-inf")).topk(k)
        values.append(top.values)
        ids.append(top.indices)
        tokens.append(sum(e - s for s, e in (spans[c] for c in taken) if e - s > 1))
        classes.append(len(taken))
    return torch.stack(values), torch.stack(ids), sum(tokens) / len(tokens), sum(classes) / len(classes)


@pytest.mark.parametrize("search_classes,k", [(1, 1), (1, 10), (2, 3), (3, 5)])
def test_class_softmax_approximate_topk_searches_the_best_classes_and_counts_its_work(search_classes, k):
    head = _head("class_softmax", 60, search_classes=search_classes)
    c = head.config
    hidden = _hidden(7)
    lp, idx = head.topk(hidden, k)
    ref_lp, ref_idx, tokens, classes = _searched_reference(head, hidden, k)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-12, atol=1e-12)
    assert torch.equal(idx, ref_idx)
    full = head(hidden)
    torch.testing.assert_close(lp, full.gather(1, idx), rtol=1e-12, atol=1e-12)  # true log-probs
    assert all(len(set(row.tolist())) == k for row in idx)  # k distinct tokens, never padding
    stats = head.last_stats
    assert stats["budget"] == c.vocab_size * D
    assert stats["tokens_scored"] == pytest.approx(tokens) and stats["classes_searched"] == pytest.approx(classes)
    assert stats["multiplications"] == pytest.approx((c.num_classes + tokens) * D)
    assert stats["multiplications"] < stats["budget"]


def test_class_softmax_approximate_topk_is_exact_when_the_class_is_clear():
    head = _head("class_softmax", 60, search_classes=1)
    with torch.no_grad():
        head.class_proj.weight.mul_(100.0)  # p(class | g) close to one-hot
    hidden = _hidden(9)
    lp, idx = head.topk(hidden, 1)
    exact_lp, exact_idx = head(hidden).topk(1)
    assert torch.equal(idx, exact_idx)
    torch.testing.assert_close(lp, exact_lp, rtol=1e-12, atol=1e-12)


def test_class_softmax_exact_topk_by_default_and_its_stats():
    head = _head("class_softmax", 60)
    c = head.config
    hidden = _hidden(4).view(2, 2, D)
    lp, idx = head.topk(hidden, 5)
    exact_lp, exact_idx = head(hidden).topk(5)
    assert torch.equal(idx, exact_idx) and lp.shape == (2, 2, 5)
    torch.testing.assert_close(lp, exact_lp)
    assert head.last_stats == {
        "multiplications": (c.num_classes + 60) * D,
        "budget": 60 * D,
        "tokens_scored": 60.0,
        "classes_searched": float(c.num_classes),
    }


def test_class_softmax_approximate_topk_in_low_precision():
    head = _head("class_softmax", 60, dtype=torch.bfloat16, search_classes=2)
    hidden = _hidden(3, dtype=torch.bfloat16)
    lp, idx = head.topk(hidden, 4)
    assert lp.dtype == torch.float32 and torch.isfinite(lp).all()
    torch.testing.assert_close(lp, head(hidden).gather(1, idx))


# ----------------------------------------------------------------------------- d_softmax
def test_d_softmax_default_bands_and_their_cost():
    head = hf_heads.build_head("d_softmax", hidden_size=512, vocab_size=10000)
    c = head.config
    sizes = [w.shape[0] for w in head.band_weights]
    assert sizes == [1429, 2857, 5714] and sum(sizes) == 10000
    assert c.band_dims == [292, 146, 74] and [w.shape[1] for w in head.band_weights] == c.band_dims
    assert c.band_fractions == [s / 10000 for s in sizes]
    cost = 1429 * 292 + 2857 * 146 + 5714 * 74
    assert head.multiplications_per_token == cost == sum(p.numel() for p in head.band_weights)
    assert cost < 0.25 * 10000 * 512  # about 4x fewer than a softmax
    head.topk(torch.randn(3, 512), 2)
    assert head.last_stats == {"multiplications": float(cost), "budget": 10000 * 512, "tokens_scored": 10000.0}


@pytest.mark.parametrize("hidden_size,vocab_size,bands", [(8, 2, 2), (1, 50, 1), (2, 50, 2), (16, 3, 3)])
def test_d_softmax_default_bands_for_tiny_sizes(hidden_size, vocab_size, bands):
    head = hf_heads.build_head("d_softmax", hidden_size=hidden_size, vocab_size=vocab_size)
    assert len(head.band_weights) == bands
    assert sum(w.shape[0] for w in head.band_weights) == vocab_size
    assert sum(w.shape[1] for w in head.band_weights) == hidden_size
    assert all(w.numel() > 0 for w in head.band_weights)


def test_d_softmax_each_band_sees_only_its_segment_of_g():
    head = _head("d_softmax", 30, band_fractions=[0.2, 0.3, 0.5], band_dims=[4, 3, 1])
    (r0, r1), (c0, c1) = head.bands[1]
    hidden = _hidden(5)
    moved = hidden.clone()
    moved[:, c0:c1] += 1.0
    diff = (head.scores_2d(moved) - head.scores_2d(hidden)).abs().amax(0)
    assert (diff[r0:r1] > 0).all()
    assert diff[:r0].max() == 0 and diff[r1:].max() == 0


def test_d_softmax_dense_weight_is_the_equivalent_softmax():
    head = _head("d_softmax", 30, band_fractions=[0.2, 0.3, 0.5], band_dims=[4, 3, 1])
    dense = head.dense_weight()
    assert dense.shape == (30, D)
    hidden = _hidden(5)
    torch.testing.assert_close(head(hidden), torch.log_softmax(hidden @ dense.T + head.bias, -1))
    mask = torch.zeros(30, D, dtype=torch.bool)
    for (r0, r1), (c0, c1) in head.bands:
        mask[r0:r1, c0:c1] = True
    assert (dense[~mask] == 0).all() and int(mask.sum()) == head.multiplications_per_token


def test_d_softmax_start_from_a_projection_keeps_each_bands_block():
    weight, bias = torch.randn(30, D), torch.randn(30)
    head = hf_heads.build_head(
        "d_softmax", hidden_size=D, vocab_size=30, weight=weight, bias=bias, band_fractions=[0.2, 0.8], band_dims=[5, 3]
    )
    assert torch.equal(head.band_weights[0], weight[:6, :5]) and torch.equal(head.band_weights[1], weight[6:, 5:])
    assert torch.equal(head.bias, bias)
    # one band keeps everything: the head is the softmax it started from
    one = hf_heads.build_head(
        "d_softmax", hidden_size=D, vocab_size=30, weight=weight, bias=bias, band_fractions=[1.0], band_dims=[D]
    )
    ref = hf_heads.build_head("softmax", hidden_size=D, vocab_size=30, weight=weight, bias=bias)
    hidden = _hidden(4, dtype=torch.float32)
    torch.testing.assert_close(one(hidden), ref(hidden))
    with pytest.raises(ValueError, match=r"weight has shape \(29, 8\); expected \(vocab_size, embedding_size\)"):
        hf_heads.build_head("d_softmax", hidden_size=D, vocab_size=30, weight=torch.randn(29, D))
    with pytest.raises(ValueError, match=r"bias has shape \(29,\); expected \(vocab_size,\) = \(30,\)"):
        hf_heads.build_head("d_softmax", hidden_size=D, vocab_size=30, weight=weight, bias=torch.randn(29))


def test_d_softmax_band_options_must_agree():
    build = lambda **kw: hf_heads.build_head("d_softmax", hidden_size=D, vocab_size=30, **kw)  # noqa: E731
    with pytest.raises(
        ValueError,
        match=r"band_dims=\[2, 2, 4\] is out of range; allowed: .*one per band of "
        r"band_fractions \(2\), summing to hidden_size=8",
    ):
        build(band_fractions=[0.5, 0.5], band_dims=[2, 2, 4])
    with pytest.raises(ValueError, match=r"band_dims=.* is out of range; allowed: at most vocab_size=3 bands"):
        hf_heads.build_head("d_softmax", hidden_size=D, vocab_size=3, band_dims=[2, 2, 2, 2])
    head = build(band_dims=[6, 2])  # fractions default to the number of bands given
    assert [w.shape for w in head.band_weights] == [(10, 6), (20, 2)]
    head = build(band_fractions=[0.5, 0.5])  # and dims too
    assert head.config.band_dims == [5, 3]


def test_d_softmax_cannot_be_tied_and_says_what_to_do():
    head = hf_heads.build_head("d_softmax", hidden_size=D, vocab_size=30)
    with pytest.raises(ValueError, match="cannot be tied to the input embedding.*weight=embedding.weight"):
        head.tie_weight(torch.nn.Embedding(30, D))
    assert not hasattr(head, "weight")  # no dense V x d matrix is kept
    assert math.isclose(sum(head.config.band_fractions), 1.0)
