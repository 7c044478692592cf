"""Upgrading the head of a trained causal LM on its cached final hidden states (hf_heads/hf/upgrade.py,
``softmax-heads upgrade``): end to end on a tiny GPT-2 with a word-level tokenizer, in seconds."""

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
