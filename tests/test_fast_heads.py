"""SVD-softmax, adaptive sampling and convert_head beyond the generic head tests (tests/test_heads.py)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

import hf_heads
from head_cases import ref_svd_softmax

V, D = 400, 48


def _trained_like(seed=0, vocab=V, dim=D, spread=4.0):
    """A projection with a decaying spectrum (like trained heads) and queries with a clear winner."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, dim, generator=g) * torch.linspace(2.0, 0.2, dim) / dim**0.5
    rows = torch.randint(0, vocab, (64,), generator=g)
    hidden = spread * (
        weight[rows] / weight[rows].norm(dim=1, keepdim=True) + 0.3 * torch.randn(64, dim, generator=g) / dim**0.5
    )
    return weight, 0.1 * torch.randn(vocab, generator=g), hidden * dim**0.5 / 4


def _svd(weight, bias, **options):
    return hf_heads.build_head(
        "svd_softmax", hidden_size=weight.shape[1], vocab_size=weight.shape[0], weight=weight, bias=bias, **options
    ).eval()


# ----------------------------------------------------------------------------- svd_softmax
@pytest.mark.parametrize("dims", ["adaptive", "leading"])
def test_svd_softmax_matches_the_slow_algorithm_at_realistic_sizes(dims):
    weight, bias, hidden = _trained_like()
    head = _svd(weight.double(), bias.double(), preview_rank=6, num_refine=20, preview_dims=dims).double()
    got = head(hidden[:5].double())
    expected = torch.stack([ref_svd_softmax(head, g) for g in hidden[:5].double()])
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


def test_svd_softmax_batch_one_equals_batched_and_counts_its_cost():
    weight, bias, hidden = _trained_like()
    head = _svd(weight, bias, preview_rank=8, num_refine=32)
    batched = head(hidden[:6])
    single = torch.cat([head(h[None]) for h in hidden[:6]])
    torch.testing.assert_close(single, batched, rtol=1e-5, atol=1e-4)
    assert head.last_stats == {
        "multiplications": D * D + 8 * V + 32 * D,
        "budget": V * D,
        "preview_rank": 8,
        "num_refine": 32,
        "preview_dims": "adaptive",
    }


def test_svd_softmax_adaptive_preview_beats_leading_at_equal_cost_on_a_flat_spectrum():
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(2000, 64, generator=g) / 8  # flat spectrum: the leading directions say little
    hidden = 3 * weight[torch.randint(0, 2000, (200,), generator=g)] * 8
    exact = (hidden @ weight.T).argmax(1)
    agree = {
        d: float(
            (
                _svd(weight, None, use_bias=False, preview_rank=6, num_refine=4, preview_dims=d)(hidden).argmax(1)
                == exact
            )
            .float()
            .mean()
        )
        for d in ("adaptive", "leading")
    }
    assert agree["adaptive"] > agree["leading"] + 0.1, agree


def test_svd_softmax_training_is_the_exact_softmax_and_the_svd_follows_the_weights():
    weight, bias, hidden = _trained_like()
    head = _svd(weight, bias, preview_rank=4, num_refine=10)
    soft = hf_heads.build_head("softmax", hidden_size=D, vocab_size=V, weight=weight, bias=bias)
    head.train()
    torch.testing.assert_close(head(hidden), soft(hidden))
    opt = torch.optim.SGD(head.parameters(), lr=1.0)
    head.loss(hidden, torch.arange(64)).backward()
    opt.step()  # in-place update: the cached SVD must be recomputed
    head.eval()
    fresh = _svd(head.weight.detach().clone(), head.bias.detach().clone(), preview_rank=4, num_refine=10)
    torch.testing.assert_close(head(hidden), fresh(hidden))


# ----------------------------------------------------------------------------- adaptive_sampling
def _sampler(weight, bias, **options):
    return hf_heads.build_head(
        "adaptive_sampling",
        hidden_size=weight.shape[1],
        vocab_size=weight.shape[0],
        weight=weight,
        bias=bias,
        **options,
    ).eval()


def _exact(weight, bias, hidden):
    return torch.log_softmax(hidden @ weight.T + bias, dim=-1)


def test_adaptive_sampling_meets_its_pac_target_with_fewer_multiplications():
    weight, bias, hidden = _trained_like(vocab=3000, dim=256, seed=1)
    head = _sampler(weight, bias, delta=0.1, epsilon=0.3)
    rate = head.success_rate(hidden)
    assert rate["success"] >= 0.9, rate  # (epsilon, delta) = (0.3, 0.1): at least 1 - delta succeed
    assert rate["gain"] > 1.2, rate  # fewer coordinate multiplications than V * d
    stats = head.last_stats
    assert stats["budget"] == 3000 * 256 and 0 < stats["multiplications"] < stats["budget"]
    assert 1 <= stats["rounds"] and 0 < stats["pulls_per_arm"] < 256


def test_adaptive_sampling_topk_log_probs_are_close_to_exact_and_indices_sorted():
    weight, bias, hidden = _trained_like(vocab=3000, dim=256, seed=2)
    head = _sampler(weight, bias)
    lp, idx = head.topk(hidden[:8], 3)
    exact = _exact(weight, bias, hidden[:8])
    assert lp.shape == idx.shape == (8, 3)
    assert (lp[:, :-1] >= lp[:, 1:]).all()
    # the probabilities of the returned tokens are within epsilon of the exact ones (log scale: log 1.3)
    assert ((lp - exact.gather(1, idx)).abs() <= 0.27).float().mean() >= 0.9


def test_adaptive_sampling_variance_scale_trades_success_for_cost_and_calibrate_fits_it():
    weight, bias, hidden = _trained_like(vocab=3000, dim=256, seed=4)
    cautious = _sampler(weight, bias).success_rate(hidden)
    bold = _sampler(weight, bias, variance_scale=0.01).success_rate(hidden)
    assert bold["gain"] > cautious["gain"]
    head = _sampler(weight, bias)
    fit = head.calibrate(hidden[:32], steps=5)
    assert head.config.variance_scale == fit["variance_scale"] <= 1.0
    assert fit["success"] >= 0.9 and fit["gain"] >= cautious["gain"] * 0.99


def test_adaptive_sampling_is_reproducible_and_handles_a_zero_query():
    weight, bias, hidden = _trained_like(vocab=1000, dim=128)
    a, b = _sampler(weight, bias, seed=7), _sampler(weight, bias, seed=7)
    assert all(torch.equal(x, y) for x, y in zip(a.topk(hidden[:4], 2), b.topk(hidden[:4], 2)))
    lp, idx = a.topk(torch.zeros(1, 128), 2)
    torch.testing.assert_close(lp[0], torch.log_softmax(bias, 0).topk(2).values)
    assert torch.equal(idx[0], bias.topk(2).indices)


# ----------------------------------------------------------------------------- convert_head
def test_convert_head_from_a_softmax_head_and_a_linear():
    weight, bias, hidden = _trained_like()
    soft = hf_heads.build_head("softmax", hidden_size=D, vocab_size=V, weight=weight, bias=bias).eval()
    svd = hf_heads.convert_head(soft, "svd_softmax", preview_rank=D)  # full preview: exact
    assert isinstance(svd, hf_heads.get_head_class("svd_softmax")) and not svd.training
    torch.testing.assert_close(svd(hidden), soft(hidden))
    lin = torch.nn.Linear(D, V)
    ada = hf_heads.convert_head(lin, "adaptive_sampling")
    assert torch.equal(ada.weight, lin.weight) and torch.equal(ada.bias, lin.bias)
    mos = hf_heads.build_head("mos", hidden_size=D, vocab_size=V)
    with pytest.raises(ValueError, match="not a softmax of W g \\+ b"):
        hf_heads.convert_head(mos, "svd_softmax")


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_convert_head_on_a_transformers_model_keeps_ties_and_saves(tmp_path):
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=32)
    ).eval()
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        ref = torch.log_softmax(model(ids).logits, -1)
    hf_heads.convert_head(model, "svd_softmax", preview_rank=32)  # plain model: swap_head
    head = hf_heads.output_head(model)
    assert head.weight is model.get_input_embeddings().weight
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref, rtol=1e-4, atol=1e-4)
    hf_heads.convert_head(model, "adaptive_sampling")  # a model with a head already: replaced in place
    assert model.config.output_head["name"] == "adaptive_sampling"
    assert hf_heads.output_head(model).weight is model.get_input_embeddings().weight
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(hf_heads.output_head(loaded)).__name__ == "AdaptiveSamplingHead"
    with torch.no_grad():
        torch.testing.assert_close(torch.log_softmax(loaded(ids).logits, -1), ref, rtol=1e-4, atol=1e-4)
    out = loaded.generate(ids[:, :3], max_new_tokens=4, do_sample=False)
    assert out.shape == (2, 7)


@pytest.mark.skipif(importlib.util.find_spec("fairseq") is None, reason="fairseq is not installed")
def test_convert_head_on_a_fairseq_model_keeps_ties_and_records_the_head(tmp_path):
    """The fairseq plugin converts its own models (the core knows no fairseq attribute): the decoder's softmax head
    becomes svd_softmax in place, tied as before, the model's args name it; a mixture head is refused."""
    import shutil

    import fairseq_plugin  # noqa: F401  (registers the head_* models and the converter)
    from fairseq import options, tasks

    for lang in ("de", "en"):  # a translation task's dictionaries: the 24 types of the saved LM's
        shutil.copy(
            os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "saved_0_1_0", "fairseq_lm", "dict.txt"),
            tmp_path / f"dict.{lang}.txt",
        )
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [
            str(tmp_path),
            "--task",
            "translation",
            "-s",
            "de",
            "-t",
            "en",
            "--arch",
            "head_transformer",
            "--output-head",
            "softmax",
            "--encoder-layers",
            "1",
            "--decoder-layers",
            "1",
            "--encoder-embed-dim",
            "16",
            "--decoder-embed-dim",
            "16",
            "--encoder-ffn-embed-dim",
            "32",
            "--decoder-ffn-embed-dim",
            "32",
            "--encoder-attention-heads",
            "2",
            "--decoder-attention-heads",
            "2",
            "--share-decoder-input-output-embed",
        ],
    )
    model = tasks.setup_task(args).build_model(args).eval()
    src, prev = torch.randint(4, 24, (2, 5)), torch.randint(4, 24, (2, 6))

    def log_probs():
        with torch.no_grad():
            return model.get_normalized_probs(model(src, torch.tensor([5, 5]), prev), log_probs=True)

    ref = log_probs()
    assert hf_heads.convert_head(model, "svd_softmax", preview_rank=16) is model
    head = model.decoder.head
    assert head.head_name == "svd_softmax" and head.weight is model.decoder.embed_tokens.weight
    assert (model.args.output_head, json.loads(model.args.head_options)) == ("svd_softmax", {"preview_rank": 16})
    torch.testing.assert_close(log_probs(), ref, rtol=1e-4, atol=1e-4)  # a full-rank preview: the same distribution
    hf_heads.convert_head(model, "mos", num_components=2)  # any head can start from a softmax-like one
    with pytest.raises(ValueError, match="a 'mos' head is not a softmax of W g \\+ b"):
        hf_heads.convert_head(model, "svd_softmax")
