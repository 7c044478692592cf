"""Upgrading the head of a trained causal LM on its cached final hidden states (hf_heads/hf/upgrade.py,
``python -m recipes.upgrade_head``): end to end on a tiny GPT-2 with a word-level tokenizer, in seconds."""

from __future__ import annotations

import json
import random

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed: run `make install`")
pytest.importorskip("scipy", reason="scipy not installed: run `make install` (the recipes extra)")

import hf_heads  # noqa: E402
from hf_heads.hf import upgrade  # noqa: E402

WORDS = [f"w{i}" for i in range(40)]


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def corpus(path, lines, seed):
    """A text with structure a head can learn: each word is mostly followed by one of two others."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        w = rng.randrange(40)
        words = []
        for _ in range(30):
            words.append(f"w{w}")
            w = (3 * w + rng.choice([1, 7])) % 40 if rng.random() < 0.9 else rng.randrange(40)
        out.append(" ".join(words))
    path.write_text("\n".join(out) + "\n")
    return str(path)


@pytest.fixture
def pretrained(tmp_path):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, n_positions=64, vocab_size=44, bos_token_id=1, eos_token_id=2, pad_token_id=0
    )
    model = transformers.GPT2LMHeadModel(config)  # ties lm_head to the input embedding
    model.save_pretrained(tmp_path / "pre")
    tokenizer().save_pretrained(tmp_path / "pre")
    files = [
        corpus(tmp_path / f"{split}.txt", n, seed)
        for split, n, seed in (("train", 120, 0), ("valid", 20, 1), ("test", 20, 2))
    ]
    return tmp_path, files


def run(tmp_path, files, head, *extra, command="hf_heads.cli.upgrade"):
    import importlib

    upgrade_head = importlib.import_module(command)

    train, valid, test = files
    return upgrade_head.main(
        [
            "--model",
            str(tmp_path / "pre"),
            "--head",
            head,
            "--train-file",
            train,
            "--valid-file",
            valid,
            "--test-file",
            test,
            "--block-size",
            "32",
            "--max-epochs",
            "4",
            "--lr",
            "1e-2",
            "--batch-tokens",
            "512",
            "--no-progress",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--output-dir",
            str(tmp_path / head),
            *extra,
        ],
        log=lambda *_: None,
    )


def test_upgrade_starts_at_the_pretrained_model_trains_only_the_head_and_saves_it(pretrained):
    tmp_path, files = pretrained
    result = run(tmp_path, files, "mos")
    assert result["head_options"] == {"num_components": 3, "context_activation": "identity", "identity_init": True}
    # step 0 is the pretrained model: the head at its start scores as the model's own lm_head
    assert result["start_valid_ppl"] == pytest.approx(result["before"]["valid"]["ppl"], rel=1e-5)
    for split in ("valid", "test"):
        assert result["after"][split]["ppl"] < 0.9 * result["before"][split]["ppl"]
        after = result["after"][split]
        assert after["lo"] < after["ppl"] < after["hi"] and after["blocks"] == result["tokens"][split] // 31
        # one word per token here (a word-level tokenizer): per word = per token; the predicted tokens' words counted
        assert result["words"][split] == after["blocks"] * 31 == result["tokens"][split]
        assert after["word_ppl"] == pytest.approx(after["ppl"], rel=1e-9)
    assert result["train_cpu_ms_per_1k_tokens"] > 0 and result["inference_cpu_ms_per_1k_tokens"] > 0
    costs = result["inference_costs"]  # the whole model's inference, timed on the first --cost-blocks test blocks
    assert costs["tokens"] == min(16, result["after"]["test"]["blocks"]) * 31
    assert costs["ratio"] == pytest.approx(
        (costs["body_ms"] + costs["head_ms"]) / (costs["body_ms"] + costs["pretrained_head_ms"])
    )
    assert result["curve"][0]["epoch"] == 0 and sum(1 for c in result["curve"] if c.get("best")) == 1
    # the saved model: the pretrained body unchanged (its tied embedding untied, not trained), the new head trained
    original = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "pre")
    upgraded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "mos").eval()
    assert type(upgraded).__name__ == "SoftmaxHeadsGPT2LMHeadModel"
    for name, tensor in original.transformer.state_dict().items():
        assert torch.equal(upgraded.transformer.state_dict()[name], tensor), name
    head = hf_heads.output_head(upgraded)
    assert not torch.equal(head.weight, original.lm_head.weight)
    assert head.weight.data_ptr() != upgraded.transformer.wte.weight.data_ptr()
    # its log-probs on a test block give the perplexity the recipe reported (the states it cached are the model's)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "mos")
    ids = torch.tensor([tok(open(files[2]).readline().strip())["input_ids"][:32]])
    with torch.no_grad():
        loss = upgraded(input_ids=ids, labels=ids).loss
    test_states = upgrade.cache_states(original, ids, str(tmp_path / "one"), progress=False)
    torch.testing.assert_close(loss, upgrade.nll_per_block(head, test_states).float()[0], rtol=1e-3, atol=1e-3)
    saved = json.loads((tmp_path / "mos" / "results.json").read_text())
    assert saved["after"]["test"]["ppl"] == result["after"]["test"]["ppl"]


def test_inference_costs_time_the_body_and_each_head_on_the_same_blocks():
    """What an upgrade costs at inference: the body's forward on the first n blocks, the pretrained head and the new
    head each scoring those blocks' states (every one after a warm-up on one block), the ratio of the sums."""
    from hf_heads.cli.upgrade import inference_costs

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=30, n_positions=16, n_embd=8, n_layer=1, n_head=2)
    model = transformers.GPT2LMHeadModel(config).eval()
    blocks = torch.randint(0, 30, (5, 9))
    states = upgrade.States(torch.randn(5 * 8, 8), blocks[:, 1:].reshape(-1), 8)

    class Seen(torch.nn.Module):  # a head that counts the tokens it scores
        def __init__(self, head):
            super().__init__()
            self.head, self.tokens = head, 0

        def loss(self, hidden, target, reduction="mean"):
            self.tokens += target.numel()
            return self.head.loss(hidden, target, reduction=reduction)

    pretrained = Seen(upgrade.pretrained_head(model))  # (its probe runs the model once: before the count starts)
    read = []
    upgrade.body(model).register_forward_pre_hook(lambda m, a, k: read.append(k["input_ids"].numel()), with_kwargs=True)
    new = Seen(hf_heads.build_head("mos", hidden_size=8, vocab_size=30, num_components=2))
    costs = inference_costs(model, pretrained, new, blocks, states, n_blocks=3, batch_size=2)
    assert costs["tokens"] == 3 * 8 and pretrained.tokens == new.tokens == (1 + 3) * 8
    assert sum(read) == (1 + 3) * 9 and read == [9, 18, 9]  # the warm-up block, then 3 blocks 2 at a time
    assert min(costs["body_ms"], costs["pretrained_head_ms"], costs["head_ms"]) > 0
    assert costs["ratio"] == pytest.approx(
        (costs["body_ms"] + costs["head_ms"]) / (costs["body_ms"] + costs["pretrained_head_ms"])
    )


def test_the_softmax_control_and_the_cache_serve_every_head(pretrained):
    """--head softmax fine-tunes the pretrained softmax the same way (the control for domain adaptation); the states
    cached by the first run serve the second (the same blocks and weights), and a cache of other blocks is refused."""
    tmp_path, files = pretrained
    first = run(tmp_path, files, "softmax", "--no-save")
    second = run(tmp_path, files, "plif", "--no-save", "--head-options", '{"num_knots": 50}')
    assert first["before"]["valid"]["ppl"] == pytest.approx(second["before"]["valid"]["ppl"], rel=1e-5)
    assert second["start_valid_ppl"] == pytest.approx(first["start_valid_ppl"], rel=1e-5)
    assert first["after"]["valid"]["ppl"] < first["before"]["valid"]["ppl"]
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "pre")
    with pytest.raises(ValueError, match="holds the states of other blocks or weights"):
        upgrade.cache_states(
            model, torch.zeros(2, 8, dtype=torch.long), str(tmp_path / "cache" / "valid"), progress=False
        )


def test_a_stopped_upgrade_goes_on_from_its_checkpoint(pretrained, monkeypatch):
    """The command stopped mid-training (here after 5 of its steps) and run again ends as the unbroken run does; the
    training state is in OUTPUT_DIR/train-state.pt until results.json is written, then removed."""
    tmp_path, files = pretrained
    whole = run(tmp_path, files, "mos", "--no-save")
    step = torch.optim.Adam.step
    calls = {"n": 0}

    def stopping(self, *a, **k):
        calls["n"] += 1
        if calls["n"] > 5:
            raise KeyboardInterrupt
        return step(self, *a, **k)

    monkeypatch.setattr(torch.optim.Adam, "step", stopping)
    argv = ("--no-save", "--checkpoint-minutes", "0", "--output-dir", str(tmp_path / "stopped"))
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, files, "mos", *argv)
    assert (tmp_path / "stopped" / "train-state.pt").exists() and not (tmp_path / "stopped" / "results.json").exists()
    monkeypatch.setattr(torch.optim.Adam, "step", step)
    again = run(tmp_path, files, "mos", *argv)
    assert again["after"] == whole["after"]
    assert [c["valid_nll"] for c in again["curve"]] == [c["valid_nll"] for c in whole["curve"]]
    assert not (tmp_path / "stopped" / "train-state.pt").exists() and (tmp_path / "stopped" / "results.json").exists()


def test_the_pretrained_score_is_kept_beside_the_states_for_that_lm_head_only(pretrained, monkeypatch):
    """The "before" of every head on the same states is scored once (pretrained_nll.pt beside the cached states) and
    equals the model's own loss; a model with another lm_head is scored again."""
    tmp_path, _ = pretrained
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "pre").eval()
    ids = torch.randint(4, 44, (3, 16), generator=torch.Generator().manual_seed(0))
    folder = str(tmp_path / "states")
    data = upgrade.cache_states(model, ids, folder, progress=False)
    first = upgrade.pretrained_nll_per_block(upgrade.pretrained_head(model), data, folder)
    with torch.no_grad():
        torch.testing.assert_close(first.mean().float(), model(input_ids=ids, labels=ids).loss, rtol=1e-4, atol=1e-4)
    scored = upgrade.nll_per_block
    monkeypatch.setattr(upgrade, "nll_per_block", lambda *a, **k: pytest.fail("scored again"))
    assert torch.equal(upgrade.pretrained_nll_per_block(upgrade.pretrained_head(model), data, folder), first)
    monkeypatch.setattr(upgrade, "nll_per_block", scored)
    upgrade.untie_output_embedding(model)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    assert not torch.equal(upgrade.pretrained_nll_per_block(upgrade.pretrained_head(model), data, folder), first)


def test_a_head_that_does_not_start_at_the_pretrained_model_is_named(pretrained):
    """MoS without its identity start is not the pretrained model at step 0: the recipe says so."""
    from hf_heads.cli import upgrade as upgrade_head

    tmp_path, (train, valid, _) = pretrained
    lines = []
    argv = ["--model", str(tmp_path / "pre"), "--head", "mos", "--train-file", train, "--valid-file", valid]
    argv += ["--head-options", '{"num_components": 2, "identity_init": false}', "--block-size", "32"]
    argv += ["--max-epochs", "1", "--no-save", "--no-progress", "--output-dir", str(tmp_path / "cold")]
    result = upgrade_head.main(argv, log=lines.append)
    assert result["start_valid_ppl"] != pytest.approx(result["before"]["valid"]["ppl"], rel=1e-3)
    assert any(line.startswith("warning: the mos head at its start scores valid perplexity") for line in lines)


def test_train_head_on_states_names_a_bad_option():
    head = hf_heads.build_head("softmax", hidden_size=4, vocab_size=6)
    data = upgrade.States(torch.zeros(6, 4), torch.zeros(6, dtype=torch.long), 3)
    with pytest.raises(ValueError, match=r"^train_head_on_states: patience=0; allowed: an integer >= 1$"):
        upgrade.train_head_on_states(head, data, data, patience=0, log=lambda *_: None)


def _states(seed, n=600, d=6, vocab=12):
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(n, d, generator=g)
    targets = (states[:, :2].sum(1) > 0).long() * 5 + torch.randint(0, 5, (n,), generator=g)
    return upgrade.States(states, targets, 20)


def _mixture(seed=0):
    torch.manual_seed(seed)  # MoS with dropout on its contexts: the global random state is part of the run
    return hf_heads.build_head("mos", hidden_size=6, vocab_size=12, num_components=3, dropout=0.3)


@pytest.mark.parametrize("stop_at", [3, 10, 11, 17])  # mid-epoch 1, the last step of epoch 1, epoch 2's first, later
def test_train_head_on_states_resumes_step_for_step(tmp_path, monkeypatch, stop_at):
    """A run stopped after any step and started again from its checkpoint ends bitwise where the unbroken run ends
    (weights, Adam's state via the weights, the curve's losses); the finished file is returned without training."""
    train, valid = _states(0), _states(1, n=200)
    options = dict(lr=3e-2, max_epochs=3, patience=3, batch_tokens=64, seed=5, progress=False, log=lambda *_: None)
    whole = _mixture()
    curve = upgrade.train_head_on_states(whole, train, valid, **options)  # 10 steps an epoch
    path = str(tmp_path / "run.pt")
    steps = {"n": 0}
    step = torch.optim.Adam.step

    def stopping(self, *a, **k):
        if steps["n"] == stop_at:
            raise KeyboardInterrupt
        steps["n"] += 1
        return step(self, *a, **k)

    monkeypatch.setattr(torch.optim.Adam, "step", stopping)
    with pytest.raises(KeyboardInterrupt):
        upgrade.train_head_on_states(_mixture(), train, valid, checkpoint=path, checkpoint_seconds=0, **options)
    monkeypatch.setattr(torch.optim.Adam, "step", step)
    torch.manual_seed(123)  # another process: its own random state, restored from the file
    lines = []
    resumed = _mixture(seed=9)  # other starting weights: the checkpoint's replace them
    again = upgrade.train_head_on_states(resumed, train, valid, checkpoint=path, **{**options, "log": lines.append})
    assert lines[0].startswith(f"{path}: going on from epoch {stop_at // 10 + 1}, step {stop_at % 10}")
    for name, tensor in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], tensor), name
    assert [c["valid_nll"] for c in again] == [c["valid_nll"] for c in curve]
    assert [c["train_nll"] for c in again[1:]] == [c["train_nll"] for c in curve[1:]]
    assert [c.get("best", False) for c in again] == [c.get("best", False) for c in curve]
    assert all(b["cpu_seconds"] >= a["cpu_seconds"] for a, b in zip(again, again[1:]))
    # the finished run is in the file: a rerun returns it and trains nothing
    monkeypatch.setattr(torch.optim.Adam, "step", stopping)
    steps["n"], lines[:] = stop_at, []
    third = _mixture(seed=4)
    fourth = upgrade.train_head_on_states(third, train, valid, checkpoint=path, **{**options, "log": lines.append})
    assert [{**c, "train_nll": 0} for c in fourth] == [{**c, "train_nll": 0} for c in again]  # nan != nan
    assert lines == [
        f"{path}: the finished run (best epoch {[c.get('best', False) for c in curve].index(True)}), not trained again"
    ]
    assert all(torch.equal(third.state_dict()[k], v) for k, v in whole.state_dict().items())


def test_train_head_on_states_refuses_another_runs_checkpoint(tmp_path):
    train, valid = _states(0), _states(1, n=200)
    path = str(tmp_path / "run.pt")
    options = dict(max_epochs=1, batch_tokens=64, progress=False, log=lambda *_: None, checkpoint=path)
    upgrade.train_head_on_states(_mixture(), train, valid, lr=1e-2, **options)
    with pytest.raises(ValueError, match=r"run.pt is the checkpoint of another run \(\{'lr': \(0.01, 0.02\)\}"):
        upgrade.train_head_on_states(_mixture(), train, valid, lr=2e-2, **options)
    other = hf_heads.build_head("softmax", hidden_size=6, vocab_size=12)
    with pytest.raises(ValueError, match="'parameters': 'other names or shapes'"):
        upgrade.train_head_on_states(other, train, valid, lr=1e-2, **options)
    with pytest.raises(ValueError, match=r"^train_head_on_states: checkpoint_seconds=-1; allowed: a number >= 0$"):
        upgrade.train_head_on_states(other, train, valid, checkpoint_seconds=-1, **options)


def test_the_more_parameters_control_starts_at_the_softmax_and_adds_what_mos_adds(pretrained):
    """python -m recipes.upgrade_head --residual-mlp mos-3 (the study's control, recipes/upgrade_control.py): a
    residual MLP before the pretrained softmax, as many parameters as MoS-3 adds over a softmax (3 d^2 + 6 d), starting
    at the pretrained model; it trains, and it cannot be saved as a head. The library command has no such option."""
    from recipes import upgrade_head
    from recipes.upgrade_control import mlp_size_matching

    tmp_path, files = pretrained
    result = run(tmp_path, files, "softmax", "--no-save", "--residual-mlp", "mos-3", command="recipes.upgrade_head")
    d = 16
    added = result["head_parameters"] - (44 * d)  # the softmax's W (no bias: GPT-2's lm_head has none)
    assert result["residual_mlp"] == mlp_size_matching(d, 3 * d * d + 6 * d) == 26
    assert abs(added - (3 * d * d + 6 * d)) <= 2 * d + 1
    assert result["start_valid_ppl"] == pytest.approx(result["pretrained_ppl"]["valid"], rel=1e-5)
    assert result["after"]["valid"]["ppl"] < result["before"]["valid"]["ppl"]
    assert (
        run(tmp_path, files, "softmax", "--no-save", "--max-epochs", "1", command="recipes.upgrade_head")[
            "residual_mlp"
        ]
        is None
    )
    base = ["--model", "m", "--train-file", "t", "--valid-file", "v"]
    for bad in (
        ["--residual-mlp", "mos-3"],
        ["--residual-mlp", "0", "--no-save"],
        ["--residual-mlp", "mos-1", "--no-save"],
    ):
        with pytest.raises(SystemExit):
            upgrade_head.parse_args(base + bad)
    from hf_heads.cli import upgrade as library_command

    with pytest.raises(SystemExit):
        library_command.parse_args(base + ["--residual-mlp", "mos-3", "--no-save"])


def test_the_moved_control_names_still_resolve_from_the_library_with_a_warning():
    """hf_heads.hf.upgrade.ResidualMLP and mlp_size_matching (documented in 0.1) moved to the study: for a release the
    old names warn and, from a checkout, are the study's; other names stay AttributeErrors."""
    from recipes import upgrade_control

    for name in ("ResidualMLP", "mlp_size_matching"):
        with pytest.warns(FutureWarning, match=rf"hf_heads.hf.upgrade.{name} moved to .*recipes.upgrade_control"):
            assert getattr(upgrade, name) is getattr(upgrade_control, name)
    with pytest.raises(AttributeError, match="no attribute 'ResidualMLQ'"):
        upgrade.ResidualMLQ  # noqa: B018


def test_the_upgrade_table_chooses_each_rows_rate_on_valid_pairs_seeds_and_resumes(pretrained, monkeypatch, request):
    """python -m recipes.upgrade_table: the rate pilot (seed 0, a shorter text), each row's rate its lowest valid NLL,
    the table's cells at that rate per seed, scored on test; a rerun runs nothing; the page's section pairs the rows
    with both controls seed by seed (Holm over the table's test comparisons)."""
    import math

    # the cells record torch's threads and the page names them: one here, whatever OMP_NUM_THREADS the run has
    threads = torch.get_num_threads()
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    torch.set_num_threads(1)

    from recipes import bottleneck_analysis, bottleneck_page, upgrade_table
    from recipes.common import stats as paired_stats

    tmp_path, _ = pretrained
    out = tmp_path / "table"
    argv = ["--model", str(tmp_path / "pre"), "--data", str(tmp_path), "--out", str(out)]
    argv += ["--rows", "softmax", "softmax-mlp", "mos-3", "--rates", "1e-3", "3e-2", "--seeds", "1", "2"]
    argv += ["--extra-rates", "0"]  # (tested below: a grid of two rates puts every best at an end)
    argv += ["--pilot-tokens", "1024", "--pilot-valid-tokens", "256", "--train-tokens", "2048", "--valid-tokens", "512"]
    argv += ["--block-size", "32", "--batch-tokens", "256"]  # passed on to recipes.upgrade_head
    result = upgrade_table.main(argv, log=lambda *_: None)
    pilot = bottleneck_analysis.collect_upgrade(str(out))["pilot"]
    assert len(pilot) == 6 and {c["tokens"]["train"] for c in pilot} == {1024 // 32 * 31}
    for row, chosen in result["rates"].items():
        scores = {c["lr"]: c["curve"][1]["valid_nll"] for c in pilot if c["row"] == row}
        assert chosen["lr"] == min(scores, key=scores.get)
        for seed in (1, 2):
            cell = result["cells"][f"{row}-seed{seed}"]
            assert cell["lr"] == chosen["lr"] and cell["seed"] == seed and cell["tokens"]["train"] == 2048 // 32 * 31
            assert "test" in cell["after"] and cell["max_epochs"] == 2 and cell["patience"] == 1
    assert result["cells"]["softmax-mlp-seed1"]["residual_mlp"] == 26
    assert result["cells"]["mos-3-seed1"]["head_options"]["num_components"] == 3
    with pytest.raises(SystemExit):
        upgrade_table.parse_args(argv[:6] + ["--seeds", "0", "1"])  # seed 0 is the pilot's
    # resumable: every cell is read back, none runs
    monkeypatch.setattr(upgrade_head_module(), "main", lambda *a, **k: pytest.fail("a finished cell ran again"))
    again = upgrade_table.main(argv, log=lambda *_: None)["cells"]
    assert json.dumps(again, sort_keys=True) == json.dumps(result["cells"], sort_keys=True)  # (NaN != NaN in ==)
    # a new machine: --restore copies the committed cells (the page's json) into a fresh --out, none runs
    page = tmp_path / "page.json"
    page.write_text(json.dumps({"upgrade": bottleneck_analysis.collect_upgrade(str(out))}))
    fresh = argv[: argv.index("--out")] + ["--out", str(tmp_path / "fresh")] + argv[argv.index("--out") + 2 :]
    restored = upgrade_table.main(fresh + ["--restore", str(page)], log=lambda *_: None)
    assert json.dumps(restored["cells"], sort_keys=True) == json.dumps(result["cells"], sort_keys=True)
    assert json.loads((tmp_path / "fresh" / "rates.json").read_text()) == result["rates"]
    # committed cells of other options stand for nothing: the table's with another --train-tokens are not copied
    other = upgrade_table.parse_args(fresh + ["--restore", str(page), "--out", str(tmp_path / "other")])
    assert upgrade_table.restore(other, "pilot", log=lambda *_: None) == 6
    other.train_tokens += 1
    assert upgrade_table.restore(other, "cells", result["rates"], log=lambda *_: None) == 0
    # the cap check (the table's command at a higher --max-epochs): its cells restore from the page's upgrade_cap part,
    # its pilot from the table's
    committed = bottleneck_analysis.collect_upgrade(str(out))
    cap_meta = {**committed["meta"], "args": {**committed["meta"]["args"], "max_epochs": 3}}
    page.write_text(json.dumps({"upgrade": committed, "upgrade_cap": {"cells": committed["cells"], "meta": cap_meta}}))
    capped = upgrade_table.parse_args(fresh + ["--restore", str(page), "--out", str(tmp_path / "cap")])
    capped.max_epochs = 3
    assert upgrade_table.restore(capped, "pilot", log=lambda *_: None) == 6
    assert upgrade_table.restore(capped, "cells", result["rates"], log=lambda *_: None) == 6
    capped.max_epochs, capped.out = 4, str(tmp_path / "cap4")  # neither part ran at this cap
    assert upgrade_table.restore(capped, "cells", result["rates"], log=lambda *_: None) == 0
    # the page's section
    up = bottleneck_analysis.collect_upgrade(str(out))
    rows = {(r["row"], r["control"]): r for r in bottleneck_analysis.upgrade_rows(up)}
    assert set(rows) == {("softmax-mlp", "softmax"), ("mos-3", "softmax"), ("mos-3", "softmax-mlp")}
    table_rows = ("softmax", "softmax-mlp", "mos-3")
    nll = {k: math.log(c["after"]["test"]["ppl"]) for k, c in result["cells"].items()}
    expected = sum(nll[f"mos-3-seed{s}"] - nll[f"softmax-seed{s}"] for s in (1, 2)) / 2
    assert rows[("mos-3", "softmax")]["paired"].mean == pytest.approx(expected)
    holm = paired_stats.holm([r["paired"].p for r in bottleneck_analysis.upgrade_rows(up)])
    assert [r["holm"] for r in bottleneck_analysis.upgrade_rows(up)] == holm
    text = "\n".join(bottleneck_page.upgrade_section(up))
    assert "| MoS-3 | (a) | 2 |" in text
    assert f"| MoS-3 | (a) | 2 | {expected:+.4f} [" in text  # the pair's mean, as computed from the cells
    # the whole model's inference cost, upgraded over pretrained, timed in each cell: its mean over the row's seeds
    table = text.split("| row | lr | parameters added")[1]
    mos_row = next(line for line in table.splitlines() if line.startswith("| MoS-3 |"))
    ratios = [result["cells"][f"mos-3-seed{s}"]["inference_costs"]["ratio"] for s in (1, 2)]
    assert mos_row.endswith(f"| {bottleneck_page.mean_sd(ratios, 3)} |") and "x pretrained" in table
    names = bottleneck_analysis.NAMES  # the pilot table: each row's valid NLL per rate, bold its chosen rate's
    for r in table_rows:
        scores = {c["lr"]: c["curve"][1]["valid_nll"] for c in pilot if c["row"] == r}
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| {names[r]} | ") and "**" in ln)
        assert f"**{scores[result['rates'][r]['lr']]:.4f}**" in line and line.count("**") == 2
    assert "| (b) softmax + residual MLP (MoS-3's added parameters) |" in text
    # the run's options (OUT/meta.json): the rerun command with every one, passed options last; the seeds planned
    assert up["meta"]["args"]["seeds"] == [1, 2] and up["meta"]["passed"] == argv[-4:]
    command = upgrade_table.command_line(up["meta"])
    assert "--rows softmax softmax-mlp mos-3 --rates 0.001 0.03" in command and command.endswith(" ".join(argv[-4:]))
    assert "--seeds 1 2 " in command and "--max-epochs 2" in command
    # a table short of its seeds says so: the seed-2 cells gone, each row and comparison has "1 of 2"
    up["cells"] = [c for c in up["cells"] if c["seed"] == 1]
    text = "\n".join(bottleneck_page.upgrade_section(up))
    assert "(1 of 2) |" in text and "| MoS-3 | (a) | 1 of 2 |" in text


def upgrade_head_module():
    from recipes import upgrade_head

    return upgrade_head


def test_a_pilot_rate_at_an_end_of_the_grid_is_tried_one_step_past_it(tmp_path, monkeypatch):
    """recipes.upgrade_table: a row whose best pilot rate is the grid's top (bottom) tries the rate a grid step
    above (below) it, again while that one is best, up to --extra-rates; a row best inside the grid tries none; a
    diverged (NaN) rate is never chosen."""
    import math

    from recipes import upgrade_table

    best = {"softmax": 3e-3, "mos-3": 3e-4, "plif": 1e-5}  # each row's valid NLL is lowest at this rate
    ran = []

    def fake(argv, dry_run, log):
        out = argv[argv.index("--output-dir") + 1]
        row = next(r for r in best if f"/{r}-" in out)
        lr = float(argv[argv.index("--lr") + 1])
        if "/rates/" in out:  # the pilot's cells (the table's are under cells/)
            ran.append((row, lr))
        nll = math.nan if lr > 1e-2 else abs(math.log(lr / best[row]))
        return {"curve": [{"valid_nll": 9.0}, {"valid_nll": nll}], "lr": lr}

    monkeypatch.setattr(upgrade_table, "run_cell", fake)
    (tmp_path / "data").mkdir()
    for split in ("train", "valid", "test"):
        (tmp_path / "data" / f"{split}.txt").write_text("x\n")
    argv = ["--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--rows", *best, "--seeds", "1"]
    (tmp_path / "out").mkdir()
    result = upgrade_table.main(argv + ["--rates", "1e-4", "3e-4", "1e-3", "--extra-rates", "2"], log=lambda *_: None)
    extra = {row: sorted(lr for r, lr in ran if r == row and lr not in (1e-4, 3e-4, 1e-3)) for row in best}
    assert extra["mos-3"] == []  # best inside the grid
    # 3.3e-3 best, so one more: 1.1e-2 diverges (NaN), never chosen
    assert extra["softmax"] == pytest.approx([1e-3 * 10 / 3, 1e-3 * (10 / 3) ** 2], rel=1e-5)
    assert extra["plif"] == pytest.approx([1e-4 / 9, 1e-4 / 3], rel=1e-5)  # down twice: the cap of 2
    rates = json.loads((tmp_path / "out" / "rates.json").read_text())
    assert rates["softmax"]["lr"] == pytest.approx(1e-3 * 10 / 3, rel=1e-5) and rates["mos-3"]["lr"] == 3e-4
    assert result["rates"]["plif"]["lr"] == pytest.approx(1e-4 / 9, rel=1e-5)
    with pytest.raises(SystemExit):
        upgrade_table.parse_args(argv + ["--extra-rates", "-1"])
    assert (
        upgrade_table.best_rate(
            {1e-3: {"curve": [{}, {"valid_nll": math.nan}]}, 1e-4: {"curve": [{}, {"valid_nll": 5.0}]}}
        )
        == 1e-4
    )


def test_a_cells_row_is_read_back_from_the_folder_the_table_names():
    """recipes.upgrade_table.row_of inverts cell_dir for pilot and table cells, rows with dashes and small rates too
    (the page's collector reads each cell's row this way)."""
    import argparse

    from recipes import upgrade_table

    args = argparse.Namespace(out="/o")
    for row in ("softmax", "softmax-mlp", "mos-3"):
        for stage, key in (("pilot", 1e-05), ("pilot", 0.003), ("cells", 2)):
            assert upgrade_table.row_of(upgrade_table.cell_dir(args, stage, row, key)) == row


def test_a_states_cache_is_the_same_cache_with_one_thread_or_two():
    """The cache's fingerprint digests the blocks and the body's weights byte for byte: the same under 1 and 2 threads
    (a per-tensor sum, as before, differed in its last bits: SmolLM2's cache made with two threads was refused by a run
    with one), and another for a weight one ulp away."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=576, n_inner=1536, n_head=4, vocab_size=64, n_positions=32)
    model, blocks, threads = GPT2LMHeadModel(config), torch.randint(0, 64, (2, 8)), torch.get_num_threads()
    weight = model.transformer.h[0].mlp.c_fc.weight  # [576, 1536]: its float sum differs between 1 and 2 threads
    try:
        torch.set_num_threads(1)
        one = upgrade.fingerprint(model, blocks)
        torch.set_num_threads(2)
        assert upgrade.fingerprint(model, blocks) == one
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        weight[0, 0] = torch.nextafter(weight[0, 0], torch.tensor(1.0))
    assert upgrade.fingerprint(model, blocks) != one
    assert upgrade.fingerprint(model, blocks[:1]) != upgrade.fingerprint(model, blocks)
