"""OutputHead.resize_vocab: every head grows and shrinks its vocabulary consistently, or refuses up front."""

from __future__ import annotations

import pytest
import torch

import hf_heads
from hf_heads.heads.mos import MoSHead
from head_cases import HEAD_CASES, HIDDEN, VOCAB, build_case, randomise

CASES = [c for c in HEAD_CASES if hf_heads.get_head_class(c.name).resizable]
REFUSING = sorted({c.name for c in HEAD_CASES} - {c.name for c in CASES})


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_resize_keeps_the_old_rows_and_saves(case, tmp_path):
    head = randomise(build_case(case, torch.float64))
    if hasattr(head.config, "gate_noise"):
        head.config.gate_noise = 0.0 if isinstance(head.config.gate_noise, float) else False
    old_weight = head.weight.detach().clone()
    g = torch.randn(5, HIDDEN, dtype=torch.float64)
    lp_old = head(g)
    new_rows = torch.randn(3, head.config.embedding_size, dtype=torch.float64)
    weight = torch.cat([old_weight.reshape(-1, VOCAB, head.config.embedding_size)[0], new_rows])
    head.resize_vocab(VOCAB + 3, weight=weight)
    assert head.config.vocab_size == VOCAB + 3
    lp = head(g)
    assert lp.shape == (5, VOCAB + 3)
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(5, dtype=torch.float64))
    if not case.approximate and not isinstance(head, MoSHead):
        # one softmax: the old ids keep their logits, the new ids only take mass, so renormalised over the old
        # ids nothing moved (not for a mixture of softmaxes, whose components renormalise differently, nor for
        # the SVD preview, whose decomposition changes with W)
        torch.testing.assert_close(lp[:, :VOCAB].log_softmax(-1), lp_old)
    w = head.weight.detach()
    torch.testing.assert_close(w[..., :VOCAB, :], old_weight)  # old ids keep their rows (every DS expert too)
    torch.testing.assert_close(w[..., VOCAB:, :], new_rows.expand_as(w[..., VOCAB:, :]))
    target = torch.tensor([0, VOCAB, VOCAB + 2, 1, 2])
    torch.testing.assert_close(head.loss(g, target), -lp.gather(1, target[:, None]).mean())
    head.train()
    head.loss(g, target).backward()  # training (the lean loss) at the new size
    head.eval()
    if getattr(head.config, "num_frequent", 0) > VOCAB - 2:  # Mixtape cannot drop ids that have their own gates
        with pytest.raises(ValueError, match="at least the 11 frequent ids"):
            head.resize_vocab(VOCAB - 2)
        assert head(g).shape == (5, VOCAB + 3)
        return
    head.resize_vocab(VOCAB - 2)  # shrinking drops the last ids
    assert head(g).shape == (5, VOCAB - 2) and head.weight.shape[-2] == VOCAB - 2
    hf_heads.save_head(head, tmp_path)
    loaded = hf_heads.load_head(tmp_path).to(torch.float64).eval()
    torch.testing.assert_close(loaded(g), head(g))


def test_mixtape_keeps_its_frequent_ids_when_the_vocabulary_grows():
    head = hf_heads.build_head(
        "mixtape", hidden_size=HIDDEN, vocab_size=20, num_gates=2, frequent_fraction=0.3, gate_embedding_size=4
    )
    s = head.config.num_frequent
    gates = head.gate_embedding.detach().clone()
    head.resize_vocab(57)
    assert head.config.num_frequent == s == head.gate_embedding.shape[0]
    assert torch.equal(head.gate_embedding, gates)
    with pytest.raises(ValueError, match=f"at least the {s} frequent ids"):
        head.resize_vocab(s - 1)


def test_ds_softmax_new_classes_are_kept_by_every_expert():
    head = hf_heads.build_head("ds_softmax", hidden_size=HIDDEN, vocab_size=VOCAB, num_experts=3)
    head.mask[0, :4] = False  # pruned before the resize: stays pruned
    head.resize_vocab(VOCAB + 2)
    assert head.mask.shape == (3, VOCAB + 2) and head.mask[:, VOCAB:].all() and not head.mask[0, :4].any()


@pytest.mark.parametrize("name", REFUSING)
def test_heads_laid_out_over_the_ids_refuse_and_stay_as_they_are(name):
    case = next(c for c in HEAD_CASES if c.name == name)
    head = build_case(case)
    with pytest.raises(
        ValueError, match=rf"{name}: resizing the vocabulary \({VOCAB} -> {VOCAB + 1}\) is not supported"
    ):
        head.resize_vocab(VOCAB + 1)
    assert head.config.vocab_size == VOCAB and head(torch.randn(2, HIDDEN)).shape == (2, VOCAB)


def test_resize_rejects_a_projection_of_the_wrong_shape():
    head = hf_heads.build_head("softmax", hidden_size=HIDDEN, vocab_size=VOCAB)
    with pytest.raises(ValueError, match=r"resize_vocab weight has shape \(12, 6\); expected .* = \(14, 6\)"):
        head.resize_vocab(14, weight=torch.zeros(12, HIDDEN))
    with pytest.raises(ValueError, match=r"new vocabulary size=1 is out of range"):
        head.resize_vocab(1)


def test_mixtape_refuses_to_drop_a_frequent_id_that_is_not_among_the_first_ids():
    order = torch.arange(20).flip(0)  # ids 19..15 are the frequent ones
    head = hf_heads.build_head(
        "mixtape",
        hidden_size=HIDDEN,
        vocab_size=20,
        num_gates=2,
        frequent_fraction=0.25,
        gate_embedding_size=4,
        frequency_order=order,
    )
    with pytest.raises(ValueError, match="at least 20: shrinking would remove frequent id 19"):
        head.resize_vocab(17)
    assert head.config.vocab_size == 20 and torch.equal(head.frequency_order, order)
    head.resize_vocab(23)  # new ids are the rarest; the frequent ids stay, with their gates
    assert head.frequency_order[:20].tolist() == order.tolist() and head.frequency_order[20:].tolist() == [20, 21, 22]
    assert head.frequent_ids().tolist() == [19, 18, 17, 16, 15]


def test_svd_softmax_shrinks_num_refine_with_the_vocabulary(tmp_path):
    head = hf_heads.build_head("svd_softmax", hidden_size=HIDDEN, vocab_size=20, preview_rank=2).eval()
    assert head.config.num_refine == 20
    head.resize_vocab(12)
    g = torch.randn(3, HIDDEN)
    assert head.config.num_refine == 12 and head(g).shape == (3, 12)
    hf_heads.save_head(head, tmp_path)  # the config stays valid (num_refine <= vocab_size)
    torch.testing.assert_close(hf_heads.load_head(tmp_path).eval()(g), head(g))
