"""Check a running OpenAI-compatible server (``vllm serve DIR``) against transformers on the same saved model.

Asks the server for a greedy completion of ``--prompt`` with the top ``--logprobs`` log-probs at each step, runs the
same prompt through the saved model in transformers, and prints each step's token with both log-probs. It exits 1
where a token differs or a log-prob (the chosen token's or one of the top ones) is further than ``--tolerance``::

    softmax-heads serve-check --model mixtape-smollm2 --url http://127.0.0.1:8000/v1 --prompt "The capital of France is"

The server must serve the folder ``--model`` names, in float32 (``--dtype float32``) for the default tolerance.
"""

from __future__ import annotations

import argparse
import json
from typing import Optional

import torch


def ask(url: str, prompt: str, max_tokens: int, logprobs: int, name: Optional[str] = None):
    """The server's greedy completion of ``prompt``: ``(token ids, per-step {token id: log-prob})``. It generates
    exactly ``max_tokens`` tokens (the end-of-text token does not end it early)."""
    try:
        from openai import OpenAI
    except ImportError:
        raise SystemExit("serve-check asks the server through the openai client: pip install openai") from None
    client = OpenAI(base_url=url, api_key="unused")
    name = name or client.models.list().data[0].id
    answer = client.completions.create(
        model=name,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        logprobs=logprobs,
        extra_body={"min_tokens": max_tokens, "return_tokens_as_token_ids": True},
    )
    steps = answer.choices[0].logprobs
    token_id = lambda text: int(text.rsplit(":", 1)[1])  # noqa: E731  ("token_id:N")
    ids = [token_id(t) for t in steps.tokens]
    ranked = [
        {**{token_id(t): v for t, v in top.items()}, i: value}
        for i, value, top in zip(ids, steps.token_logprobs, steps.top_logprobs)
    ]
    return ids, ranked


def compare(model_dir: str, url: str, prompt: str, max_tokens: int = 8, logprobs: int = 5) -> dict:
    """The server's answer to ``prompt`` beside transformers' (greedy ``generate`` and each step's log-probs):
    ``{"prompt_ids", "served_ids", "hf_ids", "max_abs_diff", "steps"}``, each step the token with both log-probs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hf_heads  # noqa: F401  (registers the head models)

    served_ids, ranked = ask(url, prompt, max_tokens, logprobs)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = tokenizer(prompt)["input_ids"]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
        # the log-probs along the server's tokens (equal to transformers' where the tokens are)
        log_probs = model(torch.tensor([ids + served_ids])).logits[0, len(ids) - 1 : -1].float().log_softmax(-1)
    steps, worst = [], 0.0
    for step, (token, top) in enumerate(zip(served_ids, ranked)):
        diffs = {t: abs(v - log_probs[step, t].item()) for t, v in top.items()}
        worst = max(worst, *diffs.values())
        hf = log_probs[step, token].item()
        steps.append({"token": token, "text": tokenizer.decode([token]), "served": top[token], "hf": hf})
    return {
        "prompt_ids": ids,
        "served_ids": served_ids,
        "hf_ids": out[0, len(ids) :].tolist(),
        "max_abs_diff": worst,
        "steps": steps,
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="softmax-heads serve-check", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the saved model's folder, the one the server serves")
    p.add_argument("--url", default="http://127.0.0.1:8000/v1", help="the server's OpenAI API base URL")
    p.add_argument("--prompt", default="The capital of France is", help="the text to complete")
    p.add_argument("--max-tokens", type=int, default=8, help="new tokens (default: 8)")
    p.add_argument("--logprobs", type=int, default=5, help="top log-probs compared at each step (default: 5)")
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest log-prob difference allowed (default: 1e-4)")
    p.add_argument("--json", help="also write the comparison to this file")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    for option, value in (("--max-tokens", args.max_tokens), ("--logprobs", args.logprobs)):
        if value < 1:
            raise SystemExit(f"{option} must be >= 1, got {value}")
    result = compare(args.model, args.url, args.prompt, args.max_tokens, args.logprobs)
    print("| step | token | served log-prob | transformers log-prob |\n|---|---|---|---|")
    for i, s in enumerate(result["steps"]):
        print(f"| {i} | {s['token']} {s['text']!r} | {s['served']:.6f} | {s['hf']:.6f} |")
    same = result["served_ids"] == result["hf_ids"]
    print(
        f"tokens {'equal' if same else 'DIFFER: transformers ' + str(result['hf_ids'])}; largest log-prob difference "
        f"{result['max_abs_diff']:.2e} (tolerance {args.tolerance:g}, top {args.logprobs} at each step)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if same and result["max_abs_diff"] <= args.tolerance else 1


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
