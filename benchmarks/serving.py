"""Serving speed of each head in vLLM's CPU backend, against the same model with its plain ``lm_head``.

A SmolLM2-135M-shaped Llama (random weights: the speed does not depend on them) is saved once per head and served by
vLLM (``float32``, eager). Per batch size: the time to the first token (a request of one new token) and the decode
speed (new tokens per second past the first, from a request of ``--new-tokens`` tokens, the end-of-text token
ignored), each the median of ``--rounds`` runs after one warm-up. Run in make serve-env's environment:

    .venv-serve/bin/python -m benchmarks.serving --out results/serving-bench     # json + table.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from benchmarks.heads import SMOLLM2_135M

#: HuggingFaceTB/SmolLM2-135M's shape, as the whole-model step of benchmarks/heads.py has it
SMOLLM2 = {**SMOLLM2_135M, "max_position_embeddings": 2048}
#: (label, head, options); None: the plain model
ROWS = [
    ("plain lm_head", None, {}),
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


def timed(llm, prompts, params, rounds: int) -> float:
    """Median seconds of ``llm.generate(prompts, params)`` over ``rounds`` runs, after one."""
    llm.generate(prompts, params, use_tqdm=False)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(folder: str, args) -> dict:
    import vllm

    llm = vllm.LLM(
        model=folder, dtype="float32", enforce_eager=True, skip_tokenizer_init=True, max_model_len=256, seed=0
    )
    rows = {}
    for batch in args.batch:
        prompts = [
            vllm.TokensPrompt(prompt_token_ids=[(7 * i + j) % 1000 + 3 for j in range(32)]) for i in range(batch)
        ]
        first = vllm.SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, detokenize=False)
        many = vllm.SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True, detokenize=False)
        t_first, t_many = timed(llm, prompts, first, args.rounds), timed(llm, prompts, many, args.rounds)
        rows[batch] = {
            "ttft_ms": 1e3 * t_first,
            "decode_tokens_per_s": batch * (args.new_tokens - 1) / (t_many - t_first),
        }
    del llm
    return rows


def table(out: dict) -> str:
    batches = out["args"]["batch"]
    head = "| entry | " + " | ".join(f"batch {b}: decode tokens/s | batch {b}: first token" for b in batches) + " |"
    lines = [head, "|---|" + "---|---|" * len(batches)]
    plain = out["rows"].get("plain lm_head")
    for label, rows in out["rows"].items():
        cells = []
        for b in batches:
            r, p = rows[str(b)], plain[str(b)] if plain else None
            speed = f"{r['decode_tokens_per_s']:.1f}" + (
                f" ({r['decode_tokens_per_s'] / p['decode_tokens_per_s']:.2f}x)" if p else ""
            )
            cells += [speed, f"{r['ttft_ms']:.0f} ms" + (f" ({r['ttft_ms'] / p['ttft_ms']:.2f}x)" if p else "")]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/serving-bench")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--layers", type=int, default=SMOLLM2["num_hidden_layers"])
    args = p.parse_args(argv)
    import platform

    import torch
    import vllm

    os.makedirs(args.out, exist_ok=True)
    out = {
        "args": vars(args),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "rows": {},
    }
    for label, head, options in ROWS:
        folder = save(os.path.join(args.out, "models", head or "plain"), head, options, args.layers)
        out["rows"][label] = {str(b): r for b, r in measure(folder, args).items()}
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(out, f, indent=1)
        print(label, out["rows"][label], flush=True)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table(out) + "\n")
    print(table(out))
    return out


if __name__ == "__main__":
    main()
