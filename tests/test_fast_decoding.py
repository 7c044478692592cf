"""hf_heads.fast_decoding: a head's forward in a decoding loop through its fast topk (-inf outside its top k), the
full distribution outside the context or with gradients; transformers' generate through it: greedy and top-k sampling
equal to the full softmax's where the head is exact, the fast head's own top-1 where it approximates."""

from __future__ import annotations

import math

import pytest
import torch

import hf_heads

FAST = {
    "class_softmax": {"num_classes": 8, "search_classes": 2},
    "svd_softmax": {"preview_rank": 8, "num_refine": 4},
    "adaptive_sampling": {},
    "ds_softmax": {"num_experts": 2},
}


@pytest.mark.parametrize("name", sorted(FAST))
def test_inside_the_context_the_forward_is_the_heads_topk_and_minus_inf_elsewhere(name):
    torch.manual_seed(0)
    head = hf_heads.build_head(name, hidden_size=16, vocab_size=64, **FAST[name]).eval()
    h = torch.randn(3, 5, 16)
    full = head(h)
    with torch.no_grad(), hf_heads.fast_decoding(head, k=4):
        if name == "adaptive_sampling":  # a bandit: the same draws for the forward and the topk it is compared with
            head._generator.manual_seed(3)
        fast = head(h)
        if name == "adaptive_sampling":
            head._generator.manual_seed(3)
        lp, idx = head.topk(h, 4)
    assert fast.shape == full.shape and fast.dtype == full.dtype
    assert torch.equal(fast.gather(-1, idx), lp)
    assert int(torch.isfinite(fast).sum()) == 3 * 5 * 4 and bool((fast[~torch.isfinite(fast)] == -math.inf).all())
    assert torch.equal(head(h), full)  # the setting is put back after the block
    with hf_heads.fast_decoding(head, k=4):
        assert torch.equal(head(h), full)  # with gradients (training, a loss): the full distribution


def test_a_head_without_a_fast_path_gives_its_full_top_k_and_bad_k_is_named():
    """MoS (the default topk, which reads forward: no recursion) gives its full distribution's top k."""
    torch.manual_seed(0)
    head = hf_heads.build_head("mos", hidden_size=16, vocab_size=64, num_components=2).eval()
    h = torch.randn(4, 16)
    with torch.no_grad():
        full = head(h)
        with hf_heads.fast_decoding(head, k=3):
            fast = head(h)
    top = full.topk(3, dim=-1)
    assert torch.equal(fast.gather(-1, top.indices), top.values)
    assert int(torch.isfinite(fast).sum()) == 12
    with pytest.raises(ValueError, match=r"fast_decoding: option k=65 is out of range"):
        with hf_heads.fast_decoding(head, k=65):
            pass
    with pytest.raises(ValueError, match="holds no softmax-heads head"):
        with hf_heads.fast_decoding(torch.nn.Linear(2, 2)):
            pass


def _model(head, **options):
    transformers = pytest.importorskip("transformers", reason="transformers not installed: run `make install`")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=64)
    config.pad_token_id = 0
    model = transformers.GPT2LMHeadModel(config)
    return hf_heads.swap_head(model, head, **options).eval()


def test_generate_through_an_exact_fast_head_is_the_full_softmaxs_greedy_and_top_k_sampling():
    """class_softmax searching every class: its topk is exact, so generate in the context gives the same tokens,
    greedy and top-k sampling with the same seed, while every step runs the head's topk."""
    model = _model("class_softmax", num_classes=8)
    head = hf_heads.output_head(model)
    prompt = torch.randint(1, 64, (2, 6))
    calls = []
    topk = type(head).topk
    head.topk = lambda hidden, k: calls.append(k) or topk(head, hidden, k)
    for sample, k in ((dict(do_sample=False), 1), (dict(do_sample=True, top_k=5), 5)):
        torch.manual_seed(1)
        slow = model.generate(prompt, max_new_tokens=8, pad_token_id=0, **sample)
        calls.clear()
        with hf_heads.fast_decoding(model, k=k):
            torch.manual_seed(1)
            fast = model.generate(prompt, max_new_tokens=8, pad_token_id=0, **sample)
        assert torch.equal(fast, slow), sample
        assert calls and set(calls) == {k}  # the fast path ran, at the k asked


def test_generate_through_an_approximate_fast_head_follows_its_own_top_1():
    """class_softmax searching 2 classes of 8: greedy generate in the context picks, step by step, what the head's
    topk gives for the last position (a loop written by hand), scoring fewer tokens than V."""
    model = _model("class_softmax", num_classes=8, search_classes=2)
    head = hf_heads.output_head(model)
    ids = torch.randint(1, 64, (1, 6))
    with hf_heads.fast_decoding(model, k=1):
        out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert head.last_stats["tokens_scored"] < 64
    with torch.no_grad():
        for _ in range(6):
            hidden = model.transformer(ids).last_hidden_state[:, -1]
            ids = torch.cat([ids, head.topk(hidden, 1)[1]], dim=1)
    assert torch.equal(out, ids)
