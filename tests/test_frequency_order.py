"""Heads that treat ids as ordered by frequency (mixtape, class_softmax, d_softmax) on a vocabulary that is not:
the order comes from counts, and the head equals the frequency-sorted one up to the permutation."""

from __future__ import annotations

import pytest
import torch

import hf_heads

V, D = 40, 8
HEADS = {
    "mixtape": {"num_gates": 4, "frequent_fraction": 0.25, "gate_embedding_size": 4, "gate_noise": 0.0},
    "class_softmax": {"num_classes": 5},
    "d_softmax": {"band_fractions": [0.25, 0.75], "band_dims": [6, 2]},
}


def _pair(name, **extra):
    """``(sorted head, permuted head, order)``: the same head on ids sorted by frequency and on ids whose
    frequency order is a random permutation (id ``order[r]`` of the second is id ``r`` of the first)."""
    torch.manual_seed(0)
    sorted_head = hf_heads.build_head(name, hidden_size=D, vocab_size=V, **HEADS[name], **extra).double()
    with torch.no_grad():
        for p in sorted_head.parameters():
            p.add_(0.5 * torch.randn_like(p))
    order = torch.randperm(V, generator=torch.Generator().manual_seed(1))
    perm_head = hf_heads.build_head(
        name, hidden_size=D, vocab_size=V, frequency_order=order, **HEADS[name], **extra
    ).double()
    ranks = perm_head.ranks()
    state = dict(sorted_head.state_dict())
    for key in ("weight", "bias"):  # per-id rows: the permuted head's row of id order[r] is row r of the sorted
        if key in state:
            state[key] = state[key][ranks]
    state["frequency_order"] = order
    perm_head.load_state_dict(state)
    return sorted_head, perm_head, order


@pytest.mark.parametrize("name", list(HEADS))
def test_the_head_equals_the_frequency_sorted_one_up_to_the_permutation(name):
    sorted_head, perm_head, order = _pair(name)
    ranks = perm_head.ranks()
    sorted_head.eval(), perm_head.eval()
    g = torch.randn(6, D, dtype=torch.float64)
    target = torch.randint(0, V, (6,))
    torch.testing.assert_close(perm_head(g)[:, order], sorted_head(g))
    torch.testing.assert_close(perm_head.loss(g, target), sorted_head.loss(g, ranks[target]))
    lp_p, idx_p = perm_head.topk(g, 5)
    lp_s, idx_s = sorted_head.topk(g, 5)
    torch.testing.assert_close(lp_p, lp_s)
    assert torch.equal(idx_p, order[idx_s])
    # training: the memory-lean loss and its gradients, row r of the sorted head = row order[r] of the other
    sorted_head.train(), perm_head.train()
    loss_p, loss_s = perm_head.loss(g, target), sorted_head.loss(g, ranks[target])
    loss_p.backward(), loss_s.backward()
    torch.testing.assert_close(loss_p, loss_s)
    for (key, p), (_, s) in zip(perm_head.named_parameters(), sorted_head.named_parameters()):
        grad = p.grad[order] if key in ("weight", "bias") else p.grad
        torch.testing.assert_close(grad, s.grad, msg=key)


def test_mixtape_frequent_ids_and_class_softmax_classes_follow_the_counts():
    torch.manual_seed(0)
    data = [torch.randint(0, V, (50,)) for _ in range(4)] + [[7] * 300, [3] * 200, [29] * 100]
    counts = hf_heads.count_tokens(data, V)
    assert counts.sum() == 4 * 50 + 600 and counts[7] >= 300
    order = hf_heads.frequency_order(counts)
    assert order[:3].tolist() == [7, 3, 29]
    mixtape = hf_heads.build_head("mixtape", hidden_size=D, vocab_size=V, token_counts=counts, **HEADS["mixtape"])
    s = mixtape.config.num_frequent
    assert mixtape.frequent_ids()[:3].tolist() == [7, 3, 29]  # (ties among the rest: any of the equal counts)
    assert sorted(counts[mixtape.frequent_ids()].tolist()) == sorted(counts.topk(s).values.tolist())
    classes = hf_heads.build_head("class_softmax", hidden_size=D, vocab_size=V, token_counts=counts, num_classes=5)
    token_class, sizes = classes.class_tables()
    assert sizes[token_class[7]] == 1  # the most frequent id is alone in its class (Zipf binning by rank)
    assert token_class[7] == 0 and token_class[3] == token_class[order[1]]


def test_the_order_is_saved_with_the_head_and_through_hf(tmp_path):
    _, head, order = _pair("mixtape")
    hf_heads.save_head(head, tmp_path / "head")
    assert torch.equal(hf_heads.load_head(tmp_path / "head").frequency_order, order)
    transformers = pytest.importorskip("transformers", reason="transformers not installed: run `make install`")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.GPT2Config(n_layer=1, n_embd=D, n_head=2, vocab_size=V, n_positions=16)
    )
    counts = torch.arange(V) % 7  # not sorted by id
    hf_heads.swap_head(model, "mixtape", token_counts=counts, **HEADS["mixtape"])
    assert "token_counts" not in model.config.output_head["options"]
    model.save_pretrained(tmp_path / "model")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert torch.equal(hf_heads.output_head(loaded).frequency_order, hf_heads.frequency_order(counts))
    ids = torch.randint(0, V, (1, 5))
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(ids).logits, model.eval()(ids).logits)


def test_bad_orders_are_refused_with_what_is_allowed():
    with pytest.raises(
        ValueError,
        match=r"mixtape: frequency_order \(length 39, .*\) must be a permutation of the "
        r"token ids 0..39",
    ):
        hf_heads.build_head("mixtape", hidden_size=D, vocab_size=V, frequency_order=torch.arange(39))
    with pytest.raises(ValueError, match="must be a permutation"):
        hf_heads.build_head("mixtape", hidden_size=D, vocab_size=V, frequency_order=torch.zeros(V, dtype=torch.long))
    with pytest.raises(ValueError, match="token_counts has 3 entries; expected one per token id, vocab_size=40"):
        hf_heads.build_head("class_softmax", hidden_size=D, vocab_size=V, token_counts=[1, 2, 3])
    with pytest.raises(ValueError, match="mos: frequency_order / token_counts do not apply"):
        hf_heads.build_head("mos", hidden_size=D, vocab_size=V, token_counts=torch.ones(V))
    with pytest.raises(ValueError, match=r"count_tokens: id 40 is out of range; allowed: \[0, 40\)"):
        hf_heads.count_tokens([[1, 40]], V)


def test_count_tokens_reads_ragged_batches_mappings_and_skips_ignored_ids():
    from collections import UserDict  # transformers' BatchEncoding is a UserDict, not a dict

    data = [
        {"input_ids": [[1, 2], [3, 3, 3]]},
        UserDict({"input_ids": torch.tensor([[4, 4]])}),
        {"labels": [5, -100]},
        torch.tensor([[6], [-100]]),
        [7],
    ]
    assert hf_heads.count_tokens(data, 9).tolist() == [0, 1, 1, 3, 2, 1, 1, 1, 0]
    with pytest.raises(ValueError, match="needs 'input_ids' or 'labels'"):
        hf_heads.count_tokens([{"attention_mask": [1]}], 9)
    assert hf_heads.frequency_order(torch.tensor([2, 5, 5, 0])).tolist() == [1, 2, 0, 3]  # ties: smaller id first
