"""lm-evaluation-harness on a saved head model, in a process that cannot import softmax-heads: its rolling word
perplexity of local documents (hf_heads/cli/lm_eval.py's task, no download) equals ours."""

import json
import os
import subprocess
import sys

import pytest
import torch

import hf_heads

pytest.importorskip(
    "lm_eval", reason="lm-eval not installed: `make install` installs it on Python >= 3.11 (the clients extra)"
)
pytest.importorskip("datasets", reason="datasets comes with lm-eval: run `make install`")

from hf_heads.cli import lm_eval as lm_eval_local  # noqa: E402
from test_remote_code import WITHOUT_PACKAGE  # noqa: E402
from test_trl import head_model, sentences, tokenizer  # noqa: E402

#: lm-eval's command line, run where the package cannot be imported
LM_EVAL = WITHOUT_PACKAGE + 'import runpy\nrunpy.run_module("lm_eval", run_name="__main__")\n'


@pytest.mark.parametrize("name", ["mixtape"])
def test_lm_eval_word_perplexity_equals_ours_without_the_package(tmp_path, name):
    model, tok = head_model(name), tokenizer()
    torch.manual_seed(5)
    with torch.no_grad():  # not a fresh head: gates and components that differ
        for p in hf_heads.output_head(model).parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    text = tmp_path / "docs.txt"  # 8 short documents and one longer than the model's window (rolling windows)
    text.write_text("\n".join(sentences(8, 3) + [" ".join(sentences(20, 4))]) + "\n")

    docs = lm_eval_local.read_docs(str(text), 0)
    task = lm_eval_local.write_task(docs, str(tmp_path / "task"))
    window = lm_eval_local.max_length(model.config, tok)
    assert len(tok(docs[-1])["input_ids"]) > 2 * window
    ours = lm_eval_local.word_perplexity(model, tok, docs, window)

    command = lm_eval_local.lm_eval_command(str(tmp_path / "model"), task, window, str(tmp_path / "out"))
    assert command[1:3] == ["-m", "lm_eval"]
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": "",
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
        "HF_DATASETS_CACHE": str(tmp_path / "datasets"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", LM_EVAL] + command[3:],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = lm_eval_local.read_lm_eval_word_perplexity(str(tmp_path / "out"))
    assert theirs == pytest.approx(ours, rel=1e-6)
    results = json.loads(max((tmp_path / "out").rglob("results*.json"), key=os.path.getmtime).read_text())
    assert "trust_remote_code" in str(results["config"]["model_args"])
