"""studies.fast_softmax.decoding: the decoding study's agreement and speed measurements on a tiny GPT-2 with
class_softmax heads, exact (every class searched: full agreement, no distance, identical text) and approximate
(2 classes of 8), checked against the same quantities computed by hand."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

import hf_heads
from studies.fast_softmax import decoding

transformers = pytest.importorskip("transformers", reason="transformers not installed: run `make install`")


def _model(**options):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=64)
    model = hf_heads.swap_head(transformers.GPT2LMHeadModel(config), "class_softmax", num_classes=8, **options)
    return model.eval()


def _generate(model):
    """The command's own greedy ``generate(prompt, fast, n)``, 6 new tokens unless told."""
    greedy = decoding.hf_generate(model, pad_id=0)
    return lambda prompt, fast, n=6: greedy(prompt, fast, n)


def test_an_exact_fast_head_agrees_everywhere():
    model = _model()
    head, hidden = hf_heads.output_head(model), torch.randn(40, 16)
    assert decoding.top1_agreement(head, hidden) == 1.0
    assert max(decoding.topk_total_variation(head, hidden, 5)) < 1e-6
    prompts = [torch.randint(1, 64, (1, 4)) for _ in range(3)]
    assert decoding.greedy_prefix(_generate(model), prompts) == [6, 6, 6]


def test_an_approximate_fast_head_is_measured_as_by_hand():
    model = _model(search_classes=2)
    head, hidden = hf_heads.output_head(model), torch.randn(200, 16) * 3
    with torch.no_grad():
        full = head(hidden)
        fast_top1 = head.topk(hidden, 1)[1][:, 0]
        lp, idx = head.topk(hidden, 5)
    agree = decoding.top1_agreement(head, hidden)
    assert agree == pytest.approx(float((fast_top1 == full.argmax(-1)).double().mean())) and agree < 1.0
    tv = decoding.topk_total_variation(head, hidden, 5)
    for i in range(0, 200, 37):  # by hand: the two renormalised top-5 distributions over the union of their ids
        p = dict(zip(full[i].topk(5).indices.tolist(), torch.softmax(full[i].topk(5).values, 0).tolist()))
        q = dict(zip(idx[i].tolist(), torch.softmax(lp[i], 0).tolist()))
        assert tv[i] == pytest.approx(0.5 * sum(abs(p.get(j, 0) - q.get(j, 0)) for j in set(p) | set(q)), abs=1e-6)
    assert max(tv) > 0 and min(tv) >= 0 and max(tv) <= 1 + 1e-6
    prompts = [torch.randint(1, 64, (1, 4)) for _ in range(4)]
    generate, prefix = _generate(model), decoding.greedy_prefix(_generate(model), prompts)
    assert min(prefix) < 6  # these prompts diverge somewhere: the check below sees a first difference
    for prompt, n in zip(prompts, prefix):
        slow, fast = generate(prompt, False)[0, 4:], generate(prompt, True)[0, 4:]
        assert torch.equal(slow[:n], fast[:n]) and (n == 6 or slow[n] != fast[n])


def test_decode_speed_times_both_paths_and_refuses_a_short_run():
    """A generate whose cost is known (a 20 ms prefill, then 10 ms a token on the fast path, 20 ms on the full one:
    sleeps: about 100 and 50 tokens per second; the tiny models' own timings are noise on a loaded machine) comes out at
    its rates."""
    import time

    prompt = torch.randint(1, 64, (1, 4))

    def generate(p, fast, n):
        time.sleep(0.02 + (n - 1) * (0.01 if fast else 0.02))
        return torch.cat([p, torch.zeros(1, n, dtype=p.dtype)], 1)

    speed = decoding.decode_speed(generate, prompt, new_tokens=4, rounds=3)
    assert set(speed) == {"full", "fast"} and all(v["prefill_s"] >= 0.02 for v in speed.values())
    fast, full = speed["fast"]["decode_tokens_per_s"], speed["full"]["decode_tokens_per_s"]
    assert 50 < fast < 150 and 25 < full < 75 and fast > full
    model = _model(search_classes=2)
    with pytest.raises(ValueError, match="made 6 tokens, not 1"):
        decoding.decode_speed(lambda p, fast, n: _generate(model)(p, fast, 6), prompt, new_tokens=4, rounds=1)


def _lstm(**options):
    from studies.common.hidden_tasks import LSTMLM

    torch.manual_seed(0)
    body = LSTMLM(64, 16, 2, 0.1).eval()
    return body, hf_heads.build_head("class_softmax", hidden_size=16, vocab_size=64, num_classes=8, **options).eval()


def test_the_lstm_decoding_loop_through_an_exact_head_is_the_full_softmaxs():
    body, head = _lstm()
    prompt = torch.randint(0, 64, (2, 5))
    slow, fast = (decoding.lstm_decode(body, head, prompt, 8, fast=f) for f in (False, True))
    assert torch.equal(slow, fast) and slow.shape == (2, 13) and torch.equal(slow[:, :5], prompt)
    drawn = [
        decoding.lstm_decode(body, head, prompt, 8, fast=f, top_k=5, generator=torch.Generator().manual_seed(2))
        for f in (False, True)
    ]
    assert torch.equal(*drawn) and not torch.equal(drawn[0], slow)  # sampled, the same draws either way


def test_the_lstm_decoding_loop_carries_its_state_and_takes_the_heads_fast_top_1():
    """Through a head searching 2 classes of 8, each new id is that head's topk on the LSTM's state after the ids
    before it (the LSTM run again over the whole sequence, by hand)."""
    body, head = _lstm(search_classes=2)
    prompt = torch.randint(0, 64, (1, 5))
    ids = decoding.lstm_decode(body, head, prompt, 8, fast=True)
    assert head.last_stats["tokens_scored"] < 64
    with torch.no_grad():
        hidden = body(ids[:, :-1])[0, 4:]  # the state after each id from the prompt's last on
        assert torch.equal(head.topk(hidden, 1)[1][:, 0], ids[0, 5:])


def test_the_decoding_command_measures_each_converted_head_and_resumes(tmp_path):
    """python -m studies.fast_softmax.decoding on a tiny GPT-2 folder: SVD-softmax converted at V = 64 refines every id
    (exact: full agreement, every greedy prefix whole), adaptive sampling's bandit approximates; speed per thread count
    for greedy and top-k sampling, the head's share of a step; a second run reads the heads already measured."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [f"w{i}" for i in range(60)]
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=64, eos_token_id=1)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    (tmp_path / "test.txt").write_text(" ".join(words[(i * 7) % 60] for i in range(200)) + "\n")
    argv = ["--model", str(tmp_path / "tiny"), "--text", str(tmp_path / "test.txt"), "--out", str(tmp_path / "out")]
    argv += ["--prompts", "3", "--prompt-tokens", "8", "--new-tokens", "4", "--top-k", "5", "--threads", "1"]
    out = decoding.main(argv + ["--rounds", "1"], log=lambda *_: None)
    svd, bandit = out["heads"]["svd_softmax"], out["heads"]["adaptive_sampling"]
    assert svd["teacher_forced_top1_agreement"] == 1.0 and svd["greedy_prefix"] == [4, 4, 4]
    assert svd["top_k_tv"] < 1e-6 and 0 <= bandit["teacher_forced_top1_agreement"] <= 1
    for mode in ("greedy", "top-5"):
        assert all(svd["speed"]["1"][mode][p]["decode_tokens_per_s"] > 0 for p in ("full", "fast"))
    assert 0 < svd["speed"]["1"]["head_share_of_decode"] < 1
    assert svd["seconds"] > 0 and svd["cpu_seconds"] > 0  # what the head's step took
    assert decoding.main(argv + ["--rounds", "1"], log=lambda *_: 1 / 0) == out  # read back, nothing measured again
    assert (
        svd["config"]["num_refine"]
        == hf_heads.build_head("svd_softmax", hidden_size=16, vocab_size=64).config.num_refine
    )
    assert svd["cache"].startswith("transformers' KV cache") and svd["dtype"] == "float32"
    with pytest.raises(SystemExit):
        decoding.parse_args(argv + ["--rounds", "0"])
    # a trained head (--head-dirs) replaces the model's output layer with its own weights; one of other sizes is refused
    torch.manual_seed(2)
    ds = hf_heads.build_head("ds_softmax", hidden_size=16, vocab_size=64, num_experts=2, use_bias=False)
    hf_heads.save_head(ds, tmp_path / "ds-2")
    hf_heads.save_head(hf_heads.build_head("softmax", hidden_size=16, vocab_size=50), tmp_path / "other")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "tiny")
    swapped = decoding.with_trained_head(model, str(tmp_path / "ds-2"))
    assert torch.equal(hf_heads.output_head(swapped).weight, ds.weight) and swapped is not model
    assert torch.equal(model.lm_head.weight, model.get_input_embeddings().weight)  # the model's own untouched
    # a softmax trained alone on a tied model's states (the DS recipe's control): untied, the input embedding kept
    control = hf_heads.build_head("softmax", hidden_size=16, vocab_size=64, use_bias=False)
    hf_heads.save_head(control, tmp_path / "control")
    untied = decoding.with_trained_head(model, str(tmp_path / "control"))
    embedding = untied.get_input_embeddings().weight
    assert torch.equal(hf_heads.output_head(untied).weight, control.weight)
    assert torch.equal(embedding, model.get_input_embeddings().weight) and not torch.equal(embedding, control.weight)
    assert not untied.config.tie_word_embeddings
    more = decoding.main(argv + ["--rounds", "1", "--heads", "--head-dirs", str(tmp_path / "ds-2")], log=lambda *_: 0)
    assert more["heads"]["ds-2"]["config"]["num_experts"] == 2 and set(more["heads"]) == {*out["heads"], "ds-2"}
    with pytest.raises(SystemExit, match="--head-dirs .*other: a head of V = 50, d = 16; this model's is V = 64"):
        decoding.main(argv + ["--heads", "--head-dirs", str(tmp_path / "other")], log=lambda *_: 0)


def test_the_decoding_command_on_the_lstm_measures_converted_and_trained_heads(tmp_path, monkeypatch):
    """--model wikitext-2-lstm: the study's LSTM read from --lm-dir (a tiny one here), each head against its trained
    softmax: the softmax itself agrees everywhere, SVD-softmax refining every id too, a trained class_softmax
    (--head-dirs) is measured under its folder's name; without the LSTM the command says how to train it, and where
    --lm-dir has none it reads the checkout's kept copy."""
    from corpora import tiny_corpus
    from corpora import TINY_LM

    from studies.common import lms

    monkeypatch.setattr(lms, "LSTM_SETTINGS", {**lms.LSTM_SETTINGS, **TINY_LM})
    text, lm_dir = tmp_path / "text", tmp_path / "lm"
    tiny_corpus(text, num_words=20, valid_lines=20, seed=2, train_lines=40)
    argv = ["--model", "wikitext-2-lstm", "--wt2-dir", str(text), "--lm-dir", str(lm_dir), "--out", str(tmp_path / "o")]
    argv += ["--prompts", "3", "--prompt-tokens", "4", "--new-tokens", "4", "--top-k", "3", "--threads", "1"]
    with pytest.raises(SystemExit, match="python -m studies.common.lms"):
        decoding.main(argv, log=lambda *_: None)
    _lstm, softmax, _ = lms.train_split_lm(str(text), "wikitext-2", str(lm_dir), progress=False, log=lambda m: 0)
    torch.manual_seed(1)
    hier = hf_heads.build_head("class_softmax", hidden_size=8, vocab_size=softmax.weight.shape[0], num_classes=4)
    hf_heads.save_head(hier, tmp_path / "class_softmax-trained")
    argv += ["--heads", "softmax", "svd_softmax", "--head-dirs", str(tmp_path / "class_softmax-trained")]
    out = decoding.main(argv + ["--rounds", "1"], log=lambda *_: None)["heads"]
    assert set(out) == {"softmax", "svd_softmax", "class_softmax-trained"}
    for name in ("softmax", "svd_softmax"):  # exact: V = 21 ids all refined by SVD-softmax's default N
        assert out[name]["teacher_forced_top1_agreement"] == 1.0 and out[name]["greedy_prefix"] == [4, 4, 4]
    trained = out["class_softmax-trained"]  # an untrained class head: it disagrees with the LSTM's softmax
    assert trained["teacher_forced_top1_agreement"] < 1.0 and trained["top_k_tv"] > 0
    # a share at all (4 new tokens of a tiny LSTM decode in microseconds: under load their time, a difference of two
    # runs, can come out negative; the real runs decode 64 tokens of a 33,278-word head)
    assert math.isfinite(out["softmax"]["speed"]["1"]["head_share_of_decode"])
    lm = out["softmax"]["lm"]
    assert lm["path"] == lms.lm_path(str(lm_dir), "wikitext-2", lms.LSTM_SETTINGS) and lm["test_ppl"] > 1
    assert trained["config"]["num_classes"] == 4 and "recurrent state" in trained["cache"]
    # a fresh clone has no --lm-dir LM: the command reads the checkout's kept copy (export_lm)
    monkeypatch.setattr(lms, "KEPT_LMS", str(tmp_path / "kept"))
    kept = lms.export_lm(str(text), "wikitext-2", str(lm_dir), log=lambda m: 0)
    argv[argv.index("--lm-dir") + 1], argv[argv.index("--out") + 1] = str(tmp_path / "empty"), str(tmp_path / "o2")
    again = decoding.main(argv[: argv.index("--heads")] + ["--heads", "softmax", "--rounds", "1"], log=lambda *_: 0)
    assert again["heads"]["softmax"]["lm"]["path"] == kept and again["heads"]["softmax"]["greedy_prefix"] == [4, 4, 4]


def _decoding_run(folder, model, share, greedy, prefix):
    """A decoding command's results.json by hand: one head, one thread count, ``greedy`` (full, fast) tokens/s."""

    def rates(full, fast):
        return {p: {"prefill_s": 0.1, "decode_tokens_per_s": v} for p, v in (("full", full), ("fast", fast))}

    speed = {"greedy": rates(*greedy), "top-50": rates(10.0, 12.5), "head_share_of_decode": share}
    head = {"teacher_forced_top1_agreement": 0.97, "top_k": 50, "top_k_tv": 0.125, "greedy_prefix": prefix}
    head["speed"] = {"1": {**speed, "load_before": 1.0, "load_after": 1.25}}
    folder.mkdir()
    (folder / "results.json").write_text(
        json.dumps({"settings": {"model": model, "new_tokens": 64}, "heads": {"svd_softmax": head}})
    )
    return str(folder)


def test_the_fast_study_page_tabulates_decoding_runs_by_model(tmp_path):
    """fast_report --decoding: each run's heads become rows of decoding.json under its model (a model collected again
    replaces its own rows); the page's two decoding tables show the agreement, the speed-ups fast / full, the head's
    share of a step, Amdahl's bound 1 / (1 - share) and the milliseconds of the full step and of the head in it,
    computed as by hand."""
    import shutil

    from studies.fast_softmax import fast_report as FR

    records, docs = tmp_path / "records", tmp_path / "docs"
    records.mkdir(), docs.mkdir()
    for name in ("ds.json", "svd_study.json"):
        shutil.copy(os.path.join(FR.RECORDS, name), records / name)
    common = ["--docs", str(docs), "--records", str(records)]
    FR.main(["--decoding", _decoding_run(tmp_path / "a", "smollm2", 0.75, (20.0, 50.0), [64, 3, 64, 10])] + common)
    lstm = _decoding_run(tmp_path / "b", "wikitext-2-lstm", 0.5, (100.0, 150.0), [1, 2, 64])
    text = FR.main(["--decoding", lstm, "--note", "paused the others"] + common)
    dec = json.loads((records / "decoding.json").read_text())
    assert [(r["model"], r["name"]) for r in dec["results"]] == [
        ("smollm2", "svd_softmax"),
        ("wikitext-2-lstm", "svd_softmax"),
    ]
    assert dec["notes"] == {"smollm2": [], "wikitext-2-lstm": ["paused the others"]}
    # median prefix (3, 10, 64, 64) -> 37.0, two of four whole; 4.00x the bound of a head that is 75% of a step
    assert "| smollm2 | svd_softmax | 0.9700 | 37.0 (64) | 0.50 | 0.1250 (50) |" in text
    assert "| wikitext-2-lstm | svd_softmax | 0.9700 | 2.0 (64) | 0.33 | 0.1250 (50) |" in text
    assert (
        "| smollm2 | svd_softmax | 1 | 20.0 | 50.0 | 2.50x | 10.0 | 12.5 | 1.25x | 0.75 | 4.00x | 50.00, 37.50 | "
        "1.00, 1.25 |" in text
    )  # 20 greedy tokens/s: a 50 ms step, 0.75 of it the head's
    assert (
        "| wikitext-2-lstm | svd_softmax | 1 | 100.0 | 150.0 | 1.50x | 10.0 | 12.5 | 1.25x | 0.50 | 2.00x | "
        "10.00, 5.00 |" in text
    )
    assert "_wikitext-2-lstm: paused the others_" in text
    nums = json.loads((records / "numbers.json").read_text())["decoding"]
    assert nums[0]["speed"]["1"] == {
        "greedy_speedup": 2.5,
        "top_k_speedup": 1.25,
        "head_share": 0.75,
        "bound": 4.0,
        "step_ms": 50.0,
        "head_ms": 37.5,
    }
    again = _decoding_run(tmp_path / "c", "smollm2", 0.5, (20.0, 20.0), [64])
    FR.main(["--decoding", again] + common)
    dec = json.loads((records / "decoding.json").read_text())
    assert [r["model"] for r in dec["results"]] == ["wikitext-2-lstm", "smollm2"] and dec["results"][1][
        "greedy_prefix"
    ] == [64]
