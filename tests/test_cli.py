"""The ``softmax-heads`` commands (hf_heads/cli): the dispatcher and its console script, the fairseq user dir, a Hub
id as ``--model`` (the Hub mocked: its id, revision and ``trust_remote_code`` reach ``from_pretrained``; a tokenizer
without a pad token, as GPT-2's), one line offline (``HF_HUB_OFFLINE=1``, through the command and
``python -m hf_heads.cli COMMAND``), and the fine-tuning and upgrade commands end to end on a tiny model in a folder
outside the checkout."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed: run `make install`")

from hf_heads.cli import __main__ as cli  # noqa: E402
from test_upgrade_head import corpus, tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args, cwd, **env):
    """``python -m ARGS`` in ``cwd`` with this checkout's packages (whatever the installed one points to)."""
    environ = {**os.environ, "PYTHONPATH": ROOT, **env}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=600
    )


@pytest.mark.skipif(sys.version_info < (3, 10), reason="importlib.metadata.entry_points(group=...) is Python 3.10+")
def test_the_console_script_is_the_dispatcher():
    scripts = {e.name: e.value for e in importlib.metadata.entry_points(group="console_scripts")}
    assert scripts.get("softmax-heads") == "hf_heads.cli.__main__:console", "make install registers the script"


def test_the_dispatcher_lists_its_commands_and_refuses_others(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("finetune", "upgrade", "lm-eval", "serve-check", "bench", "fairseq-user-dir"))
    assert cli.main(["train"]) == 2
    assert (
        "unknown command 'train'; allowed: finetune, upgrade, lm-eval, serve-check, bench, fairseq-user-dir"
        in capsys.readouterr().err
    )
    assert cli.main(["fairseq-user-dir"]) == 0
    folder = capsys.readouterr().out.strip()
    assert os.path.isfile(os.path.join(folder, "criterions.py")) and os.path.basename(folder) == "fairseq_plugin"


def _tiny(folder, pad=True):
    """A 1-layer GPT-2 over the test's words and its word-level tokenizer (``pad``: with a pad token) in ``folder``."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, n_positions=64, vocab_size=44, bos_token_id=1, eos_token_id=2
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    tok = tokenizer()
    if not pad:
        tok.pad_token = None
    tok.save_pretrained(folder)
    return str(folder)


def _texts(folder):
    return [corpus(folder / f"{split}.txt", n, seed) for split, n, seed in (("train", 40, 0), ("valid", 10, 1))]


def test_a_hub_id_reaches_from_pretrained_with_its_revision(tmp_path, monkeypatch):
    """``--model org/tiny --revision abc123``: the model and tokenizer come from the Hub (mocked: from_pretrained
    records what it was asked and loads a saved folder), ``trust_remote_code`` off unless asked; the tokenizer has no
    pad token (as GPT-2's) and gets its EOS."""
    from hf_heads.cli import finetune

    saved = _tiny(tmp_path / "hub", pad=False)
    asked = []

    def fake(cls):
        original = cls.from_pretrained.__func__

        def from_pretrained(klass, name, **kwargs):
            asked.append((klass.__name__, name, kwargs.get("revision"), kwargs.get("trust_remote_code")))
            assert name == "org/tiny"
            kwargs = {k: v for k, v in kwargs.items() if k not in ("revision", "trust_remote_code")}
            return original(klass, saved, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(from_pretrained))

    fake(transformers.AutoModelForCausalLM)
    fake(transformers.AutoTokenizer)
    train, valid = _texts(tmp_path)
    argv = ["--model", "org/tiny", "--revision", "abc123", "--train-file", train, "--valid-file", valid]
    argv += ["--block-size", "16", "--batch-size", "2", "--max-steps", "1", "--no-progress", "--head", "mos"]
    result = finetune.main(argv + ["--output-dir", str(tmp_path / "out")])
    assert asked == [
        ("AutoModelForCausalLM", "org/tiny", "abc123", False),
        ("AutoTokenizer", "org/tiny", "abc123", False),
    ]
    assert result["steps"] == 1
    assert json.loads((tmp_path / "out" / "results.json").read_text())["steps"] == 1
    reloaded = transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path / "out"))
    assert reloaded.pad_token == "</s>"  # no pad token: the EOS pads
    asked.clear()
    finetune.main(argv + ["--trust-remote-code", "--max-steps", "0", "--no-save", "--output-dir", str(tmp_path / "o2")])
    assert {a[3] for a in asked} == {True}


@pytest.mark.parametrize("command", [["hf_heads.cli", "upgrade"], ["hf_heads.cli", "finetune"]])
def test_a_hub_id_offline_ends_in_one_line(tmp_path, command):
    train, valid = _texts(tmp_path)
    run = _run(
        [*command, "--model", "gpt2", "--train-file", train, "--valid-file", valid],
        tmp_path,
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf-home"),  # an empty cache
    )
    assert run.returncode != 0
    assert "Traceback" not in run.stderr, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("--model 'gpt2': could not fetch it from the Hugging Face Hub (HF_HUB_OFFLINE=1 is set)")
    assert "hf download gpt2 --local-dir DIR" in last


def test_finetune_and_upgrade_run_from_a_folder_outside_the_checkout(tmp_path, monkeypatch, capsys):
    """``softmax-heads finetune`` then ``softmax-heads upgrade`` (the dispatcher, in this process) from a folder of
    their own, on a tiny local model: both finish and write their results there (tests/test_wheel.py runs the
    installed script where no checkout is on the path)."""
    model = _tiny(tmp_path / "tiny")
    train, valid = _texts(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["softmax-heads"])
    common = ["--train-file", train, "--valid-file", valid, "--block-size", "16", "--no-progress"]
    for argv in (
        ["finetune", "--model", model, "--head", "mixtape", "--batch-size", "2", "--max-steps", "2", "--output-dir"]
        + ["tuned", *common],
        ["upgrade", "--model", model, "--head", "mos", "--max-epochs", "1", "--batch-tokens", "128", "--cache-dir"]
        + ["cache", "--output-dir", "upgraded", *common],
    ):
        with pytest.raises(SystemExit) as done:
            cli.main(argv)
        assert done.value.code == 0
    assert "softmax-heads finetune: torch:" in capsys.readouterr().err  # the runner names the command
    assert json.loads((tmp_path / "tuned" / "results.json").read_text())["steps"] == 2
    assert json.loads((tmp_path / "upgraded" / "results.json").read_text())["head"] == "mos"
