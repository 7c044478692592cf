"""DS-Softmax beyond the generic head table: pruning, masks, the sparse inference path, mitosis."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hf_heads
from hf_heads.heads import mitosis
from head_cases import ref_ds_softmax

D, V, E = 6, 13, 3


def _head(**options):
    torch.manual_seed(0)
    return hf_heads.build_head("ds_softmax", hidden_size=D, vocab_size=V, **{"num_experts": E, **options})


def _hidden(n, seed=1):
    return torch.randn(n, D, generator=torch.Generator().manual_seed(seed))


def _pruned_head(**options):
    """A head with random parameters and a random mask (every class kept by at least one expert)."""
    head = _head(**options)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.5 * torch.randn_like(p))
        head.mask.copy_(torch.rand(E, V, generator=torch.Generator().manual_seed(3)) < 0.5)
        head.mask[torch.arange(V) % E, torch.arange(V)] = True
    return head


def test_eval_log_probs_match_reference_with_masks_and_minus_inf_outside_the_expert():
    head = _pruned_head().double().eval()
    hidden = _hidden(20).double()
    lp = head(hidden)
    expected = torch.stack([ref_ds_softmax(head, g) for g in hidden])
    torch.testing.assert_close(lp, expected, rtol=1e-10, atol=1e-10)
    expert = (hidden @ head.gate.weight.T).argmax(-1)
    assert torch.equal(torch.isfinite(lp), head.mask[expert])  # exactly the chosen expert's classes
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(20, dtype=torch.float64))


def test_eval_nll_is_the_chosen_experts_log_softmax_at_the_target_and_inf_where_it_is_pruned():
    head = _pruned_head().eval()
    hidden, target = _hidden(64), torch.randint(0, V, (64,), generator=torch.Generator().manual_seed(4))
    nll = head.nll_2d(hidden, target)
    ref = -head.log_probs_2d(hidden).gather(1, target[:, None]).squeeze(1)
    assert 0 < int(torch.isinf(nll).sum()) < 64 and torch.equal(torch.isinf(nll), torch.isinf(ref))
    torch.testing.assert_close(nll[torch.isfinite(nll)], ref[torch.isfinite(ref)])


def test_training_mode_gives_pruned_classes_logit_zero():
    head = _pruned_head(gate_noise=False).double().train()
    hidden = _hidden(9).double()
    probs = torch.softmax(hidden @ head.gate.weight.T, -1)
    gate, expert = probs.max(-1)
    w, b, m = head.weight[expert], head.bias[expert], head.mask[expert].double()
    logits = gate[:, None] * (torch.einsum("nvd,nd->nv", w, hidden) + b) * m
    torch.testing.assert_close(head(hidden), torch.log_softmax(logits, -1))
    target = torch.arange(9) % V
    torch.testing.assert_close(head.loss(hidden, target), F.cross_entropy(logits, target))


@pytest.mark.parametrize("shape", [(1,), (64,), (2, 5)], ids=["batch1", "batch64", "2x5"])
@pytest.mark.parametrize("k", [1, 3])
def test_topk_fast_path_agrees_with_full_log_probs(shape, k):
    head = _pruned_head().eval()
    hidden = torch.randn(*shape, D, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        lp, idx = head.topk(hidden, k)
        full = head(hidden)
    assert lp.shape == idx.shape == (*shape, k)
    torch.testing.assert_close(lp, full.topk(k, dim=-1).values)
    torch.testing.assert_close(lp, full.gather(-1, idx))
    assert torch.isfinite(lp).all()


def test_topk_batch_one_casts_to_the_hidden_dtype():
    head = _pruned_head().eval()  # float32 tables, float64 query: the batch-1 path casts the chosen expert
    hidden = torch.randn(1, D, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        lp, idx = head.topk(hidden, 2)
        full = head.double()(hidden)
    assert lp.dtype == torch.float64
    torch.testing.assert_close(lp, full.topk(2, dim=-1).values)
    assert torch.equal(idx, full.topk(2, dim=-1).indices)


def test_topk_asks_for_more_classes_than_an_expert_keeps():
    head = _pruned_head().eval()
    k = int(head.mask.sum(1).min()) + 2
    hidden = _hidden(10)
    with torch.no_grad():
        lp, idx = head.topk(hidden, k)
        full = head(hidden)
    torch.testing.assert_close(lp, full.topk(k, dim=-1).values)
    assert not torch.isfinite(lp).all()  # the rows whose expert keeps fewer than k classes end in -inf
    for batch in (hidden, hidden[:1]):  # inside fast_decoding the forward reads topk, whose fallback is not forward
        with torch.no_grad(), hf_heads.fast_decoding(head, k=k):
            fast = head(batch)
        torch.testing.assert_close(fast.topk(k, dim=-1).values, head(batch).topk(k, dim=-1).values)


def test_inference_tables_follow_weight_and_mask_changes():
    head = _pruned_head().eval()
    hidden = _hidden(5)
    with torch.no_grad():
        head.topk(hidden, 2)  # builds the tables
        head.weight.mul_(2.0)
        head.mask[:, 0] = True
        assert torch.equal(head.topk(hidden, 2)[1], head(hidden).topk(2, -1).indices)


def test_pruning_schedule_counts_training_steps_and_never_orphans_a_class():
    head = _head(prune_start=3, prune_interval=2, prune_cutoff=1e9)  # every row is under the cutoff
    hidden, target = _hidden(8), torch.arange(8)
    head.eval()
    head.loss(hidden, target)  # evaluation is not a training step
    head.train()
    with torch.no_grad():
        head.loss(hidden, target)  # neither is a no-grad call
    assert int(head.num_steps) == 0
    for step in (1, 2):
        head.loss(hidden, target)
        assert int(head.num_steps) == step and head.mask.all()
    head.loss(hidden, target)  # step 3 = prune_start: prunes
    kept = head.mask.sum(0)
    assert (kept == 1).all()  # every class survives in exactly one expert (its strongest)
    norms = head.class_norms()
    assert (head.weight[~head.mask] == 0).all() and (norms[head.mask] > 0).all()
    head.loss(hidden, target)
    assert int(head.num_steps) == 4 and (head.mask.sum(0) == 1).all()
    head.config.min_experts_per_class = 0  # the paper's rule: at step 5 everything under the cutoff goes
    head.loss(hidden, target)
    assert not head.mask.any()


@pytest.mark.parametrize("min_experts", [0, 1])
def test_training_prunes_unused_classes_and_keeps_the_used_ones(min_experts):
    torch.manual_seed(0)
    head = _head(
        num_experts=2,
        group_lasso=0.05,
        prune_start=150,
        prune_interval=50,
        balance=1.0,
        min_experts_per_class=min_experts,
    )
    opt = torch.optim.Adam(head.parameters(), lr=0.02)
    hidden = torch.randn(256, D)
    target = (hidden[:, 0] > 0).long() * 3  # only classes 0 and 3 occur
    for _ in range(220):
        opt.zero_grad()
        (head.loss(hidden, target) + head.aux_loss()).backward()
        opt.step()
    report = head.sparsity_report(hidden)
    assert head.mask[:, [0, 3]].any(0).all()
    if min_experts:  # the unused classes survive in one expert each
        assert (head.mask.sum(0) == 1).sum() >= V - 2 and sum(report["classes_per_expert"]) <= V + 2, report
    else:  # the paper's rule: unused classes vanish
        assert sum(report["classes_per_expert"]) <= 4 and report["expected_classes_computed"] <= 2, report
    head.eval()
    acc = (head.topk(hidden, 1)[1].squeeze(1) == target).float().mean()
    assert acc > 0.9


def test_masks_and_step_counter_survive_save_load_and_state_dict(tmp_path):
    head = _pruned_head(prune_start=7)
    head.num_steps.fill_(5)
    hf_heads.save_head(head, tmp_path / "h")
    loaded = hf_heads.load_head(tmp_path / "h")
    assert torch.equal(loaded.mask, head.mask) and int(loaded.num_steps) == 5
    hidden = _hidden(6)
    assert torch.equal(loaded.eval()(hidden), head.eval()(hidden))
    fresh = _head(prune_start=7)
    fresh.load_state_dict(head.state_dict())  # what a fairseq checkpoint resume does
    assert torch.equal(fresh.mask, head.mask) and int(fresh.num_steps) == 5


def test_aux_losses_match_their_formulas_and_have_finite_gradients_on_pruned_rows():
    head = _pruned_head(gate_noise=False).double().train()
    with torch.no_grad():
        head.weight[~head.mask] = 0.0
        head.bias[~head.mask] = 0.0
    hidden = _hidden(16).double()
    head.loss(hidden, torch.arange(16) % V)
    gate, expert = torch.softmax(hidden @ head.gate.weight.T, -1).max(-1)
    imp = torch.stack([gate[expert == e].sum() for e in range(E)])
    cv2 = imp.var(unbiased=False) / imp.mean() ** 2
    rows = torch.cat([head.weight, head.bias[..., None]], -1)  # bias entries count in the group
    norms = rows.pow(2).mean(-1).sqrt() * head.mask
    parts = head.aux_losses()
    torch.testing.assert_close(parts["balance"].double(), cv2, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(parts["group_lasso"], norms.sum().float(), rtol=1e-5, atol=1e-5)
    expert_norm = (norms.pow(2).sum(-1) / V).sqrt().sum()
    torch.testing.assert_close(parts["expert_lasso"], expert_norm.float(), rtol=1e-5, atol=1e-5)
    c = head.config
    torch.testing.assert_close(
        head.aux_loss(),
        c.balance * parts["balance"] + c.group_lasso * parts["group_lasso"] + c.expert_lasso * parts["expert_lasso"],
    )
    head.aux_loss().backward()
    assert torch.isfinite(head.weight.grad).all() and (head.weight.grad[~head.mask] == 0).all()


def test_dead_experts_are_never_chosen():
    head = _pruned_head().eval()
    with torch.no_grad():
        head.mask[1] = False
        head.mask[0, :] = True
    report = head.sparsity_report(_hidden(200))
    assert report["expert_usage"][1] == 0.0 and report["classes_per_expert"][1] == 0
    assert torch.isfinite(head(_hidden(50))).any(-1).all()


def test_sparsity_report_expected_classes():
    head = _pruned_head().eval()
    hidden = _hidden(300)
    report = head.sparsity_report(hidden)
    expert = (hidden @ head.gate.weight.T).argmax(-1)
    expected = head.mask[expert].sum(-1).float().mean().item()
    assert report["classes_per_expert"] == head.mask.sum(1).tolist()
    assert report["expected_classes_computed"] == pytest.approx(expected, rel=1e-5)
    assert report["flops_reduction"] == pytest.approx(V * D / (E * D + expected * D), rel=1e-5)
    head(hidden)  # without hidden: the queries routed since the last pruning
    assert head.sparsity_report()["expected_classes_computed"] == pytest.approx(expected, rel=1e-5)


def test_mitosis_clones_experts_and_keeps_the_outputs():
    head = _pruned_head().eval()
    grown = mitosis(head, 2 * E, noise=0.0).eval()
    assert grown.config.num_experts == 2 * E and grown.weight.shape == (2 * E, V, D)
    assert torch.equal(grown.mask, head.mask.repeat_interleave(2, 0))
    hidden = _hidden(40)
    torch.testing.assert_close(grown(hidden), head(hidden), rtol=1e-5, atol=1e-5)
    noisy = mitosis(head, 3 * E).eval()  # the default noise breaks the ties between clones
    usage = noisy.sparsity_report(_hidden(500))["expert_usage"]
    assert sum(usage[0::3]) > 0.1 and sum(usage[1::3]) > 0.1 and sum(usage[2::3]) > 0.1
    with pytest.raises(
        ValueError, match=r"num_experts=4 is out of range; allowed: a multiple of the current num_experts=3"
    ):
        mitosis(head, 4)


def test_cannot_be_tied_and_says_what_to_do():
    head = _head()
    with pytest.raises(ValueError, match="num_experts=3 separate masked copies.*weight=embedding.weight"):
        head.tie_weight(torch.nn.Embedding(V, D))


def test_gate_init_from_hidden_routes_clusters_to_distinct_experts_with_gate_near_one():
    head = _head().eval()
    g = torch.Generator().manual_seed(5)
    centres = 4.0 * torch.randn(E, D, generator=g)
    label = torch.arange(300) % E
    hidden = centres[label] + 0.3 * torch.randn(300, D, generator=g)
    head.init_gate_from_hidden(hidden)
    with torch.no_grad():
        expert, gate = head._route(hidden)
    # one expert per cluster, a different one for each cluster
    pairs = {(int(a), int(b)) for a, b in zip(label, expert)}
    assert len(pairs) == E and len({b for _, b in pairs}) == E
    assert gate.mean() > 0.9
    with pytest.raises(ValueError, match="at least num_experts=3 rows"):
        head.init_gate_from_hidden(hidden[:2])
