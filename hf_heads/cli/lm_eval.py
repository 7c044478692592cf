"""Evaluate a saved head model with lm-evaluation-harness, offline, and check its word perplexity against ours.

A model saved by ``save_pretrained`` carries the code that loads it (hf_heads/hf/remote_code.py), so lm-eval's
``hf`` model runs it with ``trust_remote_code=True`` in a process that never imports softmax-heads. This recipe
writes a local lm-eval task (``loglikelihood_rolling`` over the first ``--docs`` lines of a text file, one document
per line: no download), scores the same documents itself with the head's log-probs, runs ``lm_eval`` (``--run``)
and prints both word perplexities::

    softmax-heads finetune --model-config gpt2-tiny --train-file ../shared/data/wikitext-2/valid.txt \\
        --valid-file ../shared/data/wikitext-2/test.txt --head mixtape --max-steps 20 --output-dir out/tiny
    softmax-heads lm-eval --model out/tiny --text ../shared/data/wikitext-2/test.txt --docs 20 \\
        --out out/lm_eval --run

Without ``--run`` it prints the ``lm_eval`` command (``--include_path`` the task folder). With internet, lm-eval's
own WikiText-2 task is ``lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True --tasks wikitext``.
Both score each token once, with as much preceding context as fits the model's window (``max_length``), the first
from the tokenizer's BOS (else EOS) token; word perplexity is ``exp(-sum log p / words)``, words split on
whitespace.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from typing import List, Sequence

import torch

TASK = "softmax_heads_local"
LM_EVAL_PIN = "lm-eval==0.4.13"  # what the clients extra installs and tests run


def read_docs(text_file: str, docs: int) -> List[str]:
    """The first ``docs`` non-empty lines of ``text_file``, stripped (all of them for ``docs=0``)."""
    if docs < 0:
        raise SystemExit(f"--docs must be >= 0 (0: every line), got {docs}")
    if not os.path.isfile(text_file):
        raise SystemExit(f"--text {text_file}: no such file")
    out = []
    with open(text_file, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(line.strip())
                if len(out) == docs:
                    break
    if not out:
        raise SystemExit(f"--text {text_file}: no non-empty line")
    return out


def write_task(docs: Sequence[str], folder: str) -> str:
    """Write an lm-eval task folder (``docs.jsonl`` and ``<TASK>.yaml``) for ``--include_path``; returns the folder."""
    folder = os.path.abspath(folder)
    os.makedirs(folder, exist_ok=True)
    data = os.path.join(folder, "docs.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc}) + "\n")
    with open(os.path.join(folder, TASK + ".yaml"), "w", encoding="utf-8") as f:
        f.write(
            f"task: {TASK}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {json.dumps(data)}\n"
            'output_type: loglikelihood_rolling\ntest_split: test\ndoc_to_text: ""\n'
            'doc_to_target: "{{text}}"\nmetric_list:\n'
            + "".join(
                f"  - metric: {m}\n    aggregation: {a}\n    higher_is_better: false\n"
                for m, a in (
                    ("word_perplexity", "weighted_perplexity"),
                    ("byte_perplexity", "weighted_perplexity"),
                    ("bits_per_byte", "bits_per_byte"),
                )
            )
            + "metadata:\n  version: 1.0\n"
        )
    return folder


def max_length(config, tokenizer) -> int:
    """The model's window: its config's positions (as lm-eval reads them), else the tokenizer's limit, else 2048."""
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        if isinstance(getattr(config, attr, None), int):
            return getattr(config, attr)
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and limit < 10**9 else 2048


@torch.no_grad()
def log_likelihood(model, ids: Sequence[int], prefix: int, window: int) -> float:
    """Sum of ``log p(token | preceding tokens)`` over ``ids``, the first given ``prefix`` only; tokens are scored in
    blocks of ``window``, each block with the ``window`` tokens before its end as input."""
    seq = torch.tensor([prefix] + list(ids))
    total, start = 0.0, 0
    while start < len(ids):
        end = min(len(ids), start + window)
        width = min(window, end)
        inputs = seq[end - width : end]  # predicts ids[end - width:end]; the last end - start are new
        log_probs = model(input_ids=inputs[None]).logits[0].float().log_softmax(-1)
        targets = torch.tensor(ids[end - width : end])
        total += log_probs.gather(-1, targets[:, None])[-(end - start) :].sum().item()
        start = end
    return total


def word_perplexity(model, tokenizer, docs: Sequence[str], window: int) -> float:
    """Our word perplexity of ``docs`` (see the module docstring), with the model's head."""
    prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    total, words = 0.0, 0
    model.eval()
    for doc in docs:
        total += log_likelihood(model, tokenizer(doc, add_special_tokens=False)["input_ids"], prefix, window)
        words += len(re.split(r"\s+", doc))
    return math.exp(-total / words)


def lm_eval_command(model_dir: str, task_folder: str, window: int, output: str) -> List[str]:
    """The ``lm_eval`` command line that scores the task with the saved model's own files (no softmax-heads)."""
    return [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        "hf",
        "--model_args",
        f"pretrained={os.path.abspath(model_dir)},trust_remote_code=True,max_length={window}",
        "--device",
        "cpu",
        "--tasks",
        TASK,
        "--include_path",
        task_folder,
        "--batch_size",
        "1",
        "--output_path",
        output,
    ]


def read_lm_eval_word_perplexity(output: str) -> float:
    """lm-eval's word perplexity from the results json it wrote under ``output``."""
    found = [
        os.path.join(d, f)
        for d, _, fs in os.walk(output)
        for f in fs
        if f.startswith("results") and f.endswith(".json")
    ]
    if not found:
        raise SystemExit(f"lm_eval wrote no results json under {output}")
    with open(max(found, key=os.path.getmtime), encoding="utf-8") as f:
        return json.load(f)["results"][TASK]["word_perplexity,none"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a saved head model folder (save_pretrained), with its tokenizer")
    p.add_argument("--text", required=True, help="local text file: one document per non-empty line")
    p.add_argument("--docs", type=int, default=20, help="how many lines to score (0: all; default 20)")
    p.add_argument("--out", required=True, help="folder for the task, lm-eval's results and ours (results.json)")
    p.add_argument("--run", action="store_true", help="run lm_eval too (else print its command)")
    args = p.parse_args(argv)

    import hf_heads  # noqa: F401  (our scoring loads the model with the installed package)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    docs = read_docs(args.text, args.docs)
    task = write_task(docs, os.path.join(args.out, "task"))
    model = AutoModelForCausalLM.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    window = max_length(model.config, tokenizer)
    ours = word_perplexity(model, tokenizer, docs, window)
    results = {"docs": len(docs), "max_length": window, "word_perplexity_ours": ours}
    print(f"word perplexity, ours ({len(docs)} docs, window {window}): {ours:.4f}")
    command = lm_eval_command(args.model, task, window, os.path.join(os.path.abspath(args.out), "lm_eval"))
    if not args.run:
        print("lm-eval (" + LM_EVAL_PIN + "):\n  " + " ".join(command[2:]).replace("-m lm_eval", "lm_eval", 1))
    else:
        env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
        if subprocess.run(command, env=env).returncode != 0:
            raise SystemExit(f"lm_eval failed (is it installed? pip install {LM_EVAL_PIN})")
        theirs = read_lm_eval_word_perplexity(os.path.join(args.out, "lm_eval"))
        results["word_perplexity_lm_eval"] = theirs
        print(
            f"word perplexity, lm-eval: {theirs:.4f} (ours {ours:.4f}, relative difference "
            f"{abs(theirs - ours) / ours:.1e})"
        )
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
