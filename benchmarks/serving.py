"""Serving speed of each head in vLLM's CPU backend, against the same model with its plain ``lm_head``.

A SmolLM2-135M-shaped Llama (random weights: the speed does not depend on them) is saved once per head and served by
vLLM (``float32``, eager). Per batch size: the time to the first token (a request of one new token) and the decode
speed (new tokens per second past the first, from a request of ``--new-tokens`` tokens, the end-of-text token
ignored). The plain model's engine stays up while each head's engine runs beside it (two at a time: an engine holds
about 3 GB). After one warm-up each, ``--rounds`` rounds time the head and the plain model back to back, their order
alternating, so that each ratio (head over plain) comes from one round. The table gives the median over rounds, and
the ratio's median with its smallest and largest round. Run in make serve-env's environment:

    .venv-serve/bin/python -m benchmarks.serving --out results/serving-bench     # json + table.md
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time

from benchmarks.heads import SMOLLM2_135M

#: HuggingFaceTB/SmolLM2-135M's shape, as the whole-model step of benchmarks/heads.py has it
SMOLLM2 = {**SMOLLM2_135M, "max_position_embeddings": 2048}
PLAIN = "plain lm_head"
#: (label, head, options); None: the plain model
ROWS = [
    (PLAIN, None, {}),
    ("softmax (ours)", "softmax", {}),
    ("sigsoftmax", "sigsoftmax", {}),
    ("plif T=1e5", "plif", {"num_knots": 100000}),
    ("mixtape K=4", "mixtape", {"num_gates": 4, "frequent_fraction": 0.1, "gate_embedding_size": 64}),
    ("mos K=3", "mos", {"num_components": 3}),
    ("mos_plif K=3", "mos_plif", {"num_components": 3}),
]


def save(folder: str, head, options, layers: int) -> str:
    import torch
    import transformers

    import hf_heads

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**SMOLLM2, "num_hidden_layers": layers})
    if head is not None:
        config = hf_heads.head_config(config, head, **options)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def requests(batch: int, new_tokens: int):
    """``batch`` prompts of 32 tokens, and the parameters of a one-token and a ``new_tokens``-token request."""
    import vllm

    prompts = [vllm.TokensPrompt(prompt_token_ids=[(7 * i + j) % 1000 + 3 for j in range(32)]) for i in range(batch)]
    first, many = (
        vllm.SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, detokenize=False) for n in (1, new_tokens)
    )
    return prompts, first, many


def time_once(llm, batch: int, new_tokens: int) -> dict:
    """One timing of ``llm`` at ``batch``: time to the first token (ms) and decode tokens/s past it."""
    prompts, first, many = requests(batch, new_tokens)
    times = []
    for params in (first, many):
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        times.append(time.perf_counter() - start)
    return {"ttft_ms": 1e3 * times[0], "decode_tokens_per_s": batch * (new_tokens - 1) / (times[1] - times[0])}


def summary(rounds: dict, batches) -> dict:
    """Per entry and batch: the median of each measure over rounds, and for a head the ratio to the plain model's
    number of the same round: its median, smallest and largest over rounds. ``rounds``: head label -> rounds, each
    ``{"head": timing, "plain": timing}``."""
    measures = ("decode_tokens_per_s", "ttft_ms")
    plain = [r["plain"] for head_rounds in rounds.values() for r in head_rounds]
    out = {PLAIN: {str(b): {m: statistics.median(t[str(b)][m] for t in plain) for m in measures} for b in batches}}
    for label, head_rounds in rounds.items():
        out[label] = {}
        for b in map(str, batches):
            cell = {}
            for m in measures:
                ratios = sorted(r["head"][b][m] / r["plain"][b][m] for r in head_rounds)
                cell[m] = statistics.median(r["head"][b][m] for r in head_rounds)
                cell[m + "_ratio"] = [statistics.median(ratios), ratios[0], ratios[-1]]
            out[label][b] = cell
    return out


def table(out: dict) -> str:
    batches = out["args"]["batch"]
    head = "| entry | " + " | ".join(f"batch {b}: decode tokens/s | batch {b}: first token" for b in batches) + " |"
    lines = [head, "|---|" + "---|---|" * len(batches)]
    for label, cells in out["summary"].items():
        row = []
        for b in map(str, batches):
            c = cells[b]
            for measure, text in (("decode_tokens_per_s", "{:.1f}"), ("ttft_ms", "{:.0f} ms")):
                ratio = ""
                if label != PLAIN:
                    mid, low, high = c[measure + "_ratio"]
                    ratio = f" ({mid:.2f}x, {low:.2f}-{high:.2f})"
                row.append(text.format(c[measure]) + ratio)
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/serving-bench")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--layers", type=int, default=SMOLLM2["num_hidden_layers"])
    args = p.parse_args(argv)
    import platform

    import torch
    import vllm

    os.makedirs(args.out, exist_ok=True)

    def engine(head, options):
        folder = save(os.path.join(args.out, "models", head or "plain"), head, options, args.layers)
        llm = vllm.LLM(
            model=folder, dtype="float32", enforce_eager=True, skip_tokenizer_init=True, max_model_len=256, seed=0
        )
        for b in args.batch:  # the warm-up
            time_once(llm, b, args.new_tokens)
        return llm

    def timings(llm):
        return {str(b): time_once(llm, b, args.new_tokens) for b in args.batch}

    plain, rounds = engine(None, {}), {}
    for label, head, options in ROWS[1:]:
        llm, rounds[label] = engine(head, options), []
        for r in range(args.rounds):
            pair = {"plain": timings(plain), "head": timings(llm)} if r % 2 == 0 else {"head": timings(llm)}
            pair.setdefault("plain", timings(plain))
            rounds[label].append(pair)
            print(f"{label}, round {r + 1}: {json.dumps(pair)}", flush=True)
        del llm
        gc.collect()
    out = {
        "args": vars(args),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "rounds": rounds,
        "summary": summary(rounds, args.batch),
    }
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(out, f, indent=1)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table(out) + "\n")
    print(table(out))
    return out


if __name__ == "__main__":
    main()
