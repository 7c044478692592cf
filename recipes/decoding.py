"""What a fast head buys at decoding time, and how far it moves the text (issue 79's decoding study): the
measurements, on any head and any ``generate``-like function, kept apart from the models they run on.

Agreement, measured so that one early divergence does not decide it:

* :func:`top1_agreement`: teacher forcing on test text, the share of positions whose fast top-1 (the head's ``topk``
  through :func:`hf_heads.fast_decoding`) is the full softmax's;
* :func:`topk_total_variation`: top-k sampling, the total-variation distance between the full softmax's
  distribution renormalised over its top k and the fast head's over its own (0: the same sampler);
* :func:`greedy_prefix`: free-running greedy decoding, the length of the identical prefix per prompt.

Speed (:func:`decode_speed`): decode-only tokens per second at batch 1, prefill timed apart (a run of one new token),
the full and the fast path in interleaved rounds, medians, with the share of a decoding step in the head
(:func:`head_share`). :func:`lstm_decode` is the LSTM LM's decoding loop (the
study's WikiText-2 and PTB LMs, :class:`recipes.common.hidden_tasks.LSTMLM`), greedy or top-k sampling, through the
head's fast path or its full softmax."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

import hf_heads
from hf_heads.hf.upgrade import body
from recipes.common import data as data_paths
from recipes.common import runtime


@torch.no_grad()
def top1_agreement(head, hidden: torch.Tensor) -> float:
    """The share of the states ``hidden`` ``[N, d]`` whose top-1 through the head's fast path is the full softmax's."""
    full = head(hidden).argmax(-1)
    with hf_heads.fast_decoding(head, k=1):
        fast = head(hidden).argmax(-1)
    return float((fast == full).double().mean())


@torch.no_grad()
def topk_total_variation(head, hidden: torch.Tensor, k: int) -> List[float]:
    """Per state of ``hidden`` ``[N, d]``: the total-variation distance between top-k sampling from the full softmax
    (its k most probable ids, renormalised) and from the fast path (the head's own top k, renormalised)."""
    full = head(hidden).float()
    with hf_heads.fast_decoding(head, k=k):
        fast = head(hidden).float()  # -inf outside the fast top k
    top = full.topk(k, dim=-1)
    p = torch.zeros_like(full).scatter_(-1, top.indices, torch.softmax(top.values, dim=-1))
    q = torch.softmax(fast, dim=-1)
    return (0.5 * (p - q).abs().sum(-1)).tolist()


def greedy_prefix(generate: Callable[[torch.Tensor, bool], torch.Tensor], prompts: Sequence[torch.Tensor]) -> List[int]:
    """Per prompt (``[1, L]`` ids), how many new tokens greedy decoding through the fast path (``generate(prompt,
    True)``) shares with the full softmax's (``generate(prompt, False)``) before they first differ."""
    out = []
    for prompt in prompts:
        slow, fast = (generate(prompt, fast)[0, prompt.shape[1] :] for fast in (False, True))
        same = (slow[: len(fast)] == fast[: len(slow)]).tolist() + [False]
        out.append(same.index(False))
    return out


def decode_speed(
    generate: Callable[[torch.Tensor, bool, int], torch.Tensor], prompt: torch.Tensor, new_tokens: int, rounds: int = 5
) -> Dict[str, Dict[str, float]]:
    """Decode-only tokens per second of ``generate(prompt, fast, n)`` (which must make exactly ``n`` new tokens) for
    the full softmax and the fast path: per round, a run of one new token (the prefill and its first token) and one of
    ``1 + new_tokens``, their difference the decoding of ``new_tokens``; the two paths interleaved, a warm-up round
    first, medians. ``{"full" | "fast": {"prefill_s", "decode_tokens_per_s"}}``."""
    samples: Dict[str, Dict[str, list]] = {p: {"prefill_s": [], "decode_s": []} for p in ("full", "fast")}
    for r in range(rounds + 1):
        for path in ("full", "fast") if r % 2 else ("fast", "full"):
            times = []
            for n in (1, 1 + new_tokens):
                start = time.perf_counter()
                made = generate(prompt, path == "fast", n)
                times.append(time.perf_counter() - start)
                if made.shape[1] - prompt.shape[1] != n:
                    raise ValueError(f"decode_speed: generate made {made.shape[1] - prompt.shape[1]} tokens, not {n}")
            if r:  # round 0 warms up
                samples[path]["prefill_s"].append(times[0])
                samples[path]["decode_s"].append(times[1] - times[0])
    return {
        p: {
            "prefill_s": statistics.median(s["prefill_s"]),
            "decode_tokens_per_s": new_tokens / statistics.median(s["decode_s"]),
        }
        for p, s in samples.items()
    }


@torch.no_grad()
def lstm_decode(
    body,
    head,
    prompt: torch.Tensor,
    new_tokens: int,
    fast: bool = False,
    top_k: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """``prompt`` ``[B, L]`` and ``new_tokens`` more ids from the LSTM LM ``body`` (its embedding, LSTM and dropout,
    in evaluation mode) and ``head``, the LSTM's state carried from step to step: greedy (``top_k`` None), or sampled
    from the ``top_k`` most probable ids (renormalised; ``generator`` draws); with ``fast``, each step's distribution
    comes through the head's fast path (:func:`hf_heads.fast_decoding` with ``k = top_k or 1``)."""
    out, state = body.lstm(body.embed(prompt))
    ids = [prompt]
    with hf_heads.fast_decoding(head, k=top_k or 1) if fast else contextlib.nullcontext():
        for _ in range(new_tokens):
            log_probs = head(body.drop(out[:, -1]))
            if top_k is None:
                step = log_probs.argmax(-1, keepdim=True)
            else:
                top = log_probs.topk(top_k, dim=-1)
                pick = torch.multinomial(torch.softmax(top.values, dim=-1), 1, generator=generator)
                step = top.indices.gather(-1, pick)
            ids.append(step)
            out, state = body.lstm(body.embed(step), state)
    return torch.cat(ids, dim=1)


# ----------------------------------------------------------------------------------- the command, on an HF model


def read_ids(tokenizer, path: str, limit: int) -> torch.Tensor:
    """The first ``limit`` token ids of the text at ``path`` (its lines joined as the file has them)."""
    with open(path) as f:
        text = f.read(limit * 16)  # enough characters for ``limit`` tokens of English text
    ids = tokenizer(text, return_tensors="pt").input_ids[0]
    if len(ids) < limit:
        raise ValueError(f"--text {path}: {len(ids)} tokens in its first {limit * 16} characters, {limit} needed")
    return ids[:limit]


def hf_generate(model, pad_id: int, top_k: Optional[int] = None, seed: int = 0):
    """``generate(prompt, fast, n)`` for :func:`greedy_prefix` / :func:`decode_speed`: exactly ``n`` new tokens, greedy
    (``top_k`` None) or top-k sampling with a fixed seed, through the head's fast path with ``fast``."""

    def generate(prompt, fast, n=64):
        kwargs = dict(max_new_tokens=n, min_new_tokens=n, pad_token_id=pad_id, do_sample=top_k is not None)
        if top_k is not None:
            kwargs.update(top_k=top_k, top_p=1.0)
        torch.manual_seed(seed)
        with hf_heads.fast_decoding(model, k=top_k or 1) if fast else contextlib.nullcontext():
            return model.generate(prompt, **kwargs)

    return generate


def head_share(model, prompt: torch.Tensor, decode_s_per_token: float, rounds: int = 7) -> float:
    """The share of one decoding step's time spent in the head's full forward (one position, batch 1)."""
    head = hf_heads.output_head(model)
    with torch.no_grad():
        hidden = body(model)(prompt).last_hidden_state[:, -1:]
        times = []
        for _ in range(rounds + 1):
            start = time.perf_counter()
            head(hidden)
            times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) / decode_s_per_token


def measure_head(model, tokenizer, args, log=print) -> Dict:
    """One converted head of the model: agreement (teacher forcing, top-k TV, greedy prefixes) and, per thread count,
    prefill and decode speed of greedy and top-k sampling through its fast path against its full softmax."""
    ids = read_ids(tokenizer, args.text, args.prompts * args.prompt_tokens)
    prompts = list(ids.view(args.prompts, args.prompt_tokens)[:, None, :].unbind(0))
    head, pad = hf_heads.output_head(model), tokenizer.pad_token_id or tokenizer.eos_token_id or 0
    with torch.no_grad():
        hidden = body(model)(ids.view(args.prompts, args.prompt_tokens)).last_hidden_state.flatten(0, 1)
    out: Dict = {
        "teacher_forced_top1_agreement": top1_agreement(head, hidden),
        "top_k": args.top_k,
        "top_k_tv": statistics.fmean(topk_total_variation(head, hidden, args.top_k)),
        "greedy_prefix": greedy_prefix(lambda p, fast: hf_generate(model, pad)(p, fast, args.new_tokens), prompts),
        "speed": {},
    }
    threads_before = torch.get_num_threads()
    try:
        for threads in args.threads:
            torch.set_num_threads(threads)
            load = os.getloadavg()[0]
            row = {"load_before": load}
            for mode, top_k in (("greedy", None), (f"top-{args.top_k}", args.top_k)):
                speed = decode_speed(hf_generate(model, pad, top_k), prompts[0], args.new_tokens, args.rounds)
                row[mode] = speed
            full_step = 1.0 / row["greedy"]["full"]["decode_tokens_per_s"]
            row["head_share_of_decode"] = head_share(model, prompts[0], full_step)
            row["load_after"] = os.getloadavg()[0]
            out["speed"][str(threads)] = row
            log(f"{head.head_name}, {threads} thread(s): {json.dumps(row)}")
    finally:
        torch.set_num_threads(threads_before)
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="What a fast head buys at decoding time: speed and agreement")
    p.add_argument("--model", default="smollm2", help="a local model folder, a Hub id, or smollm2 (the shipped one)")
    p.add_argument("--text", default=os.path.join(data_paths.corpus("wikitext-2"), "test.txt"), help="prompts' text")
    p.add_argument("--heads", nargs="+", default=["svd_softmax", "adaptive_sampling"], help="heads to convert to")
    p.add_argument("--prompts", type=int, default=100, help="prompts of --prompt-tokens tokens, from the text's start")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated after each prompt")
    p.add_argument("--top-k", type=int, default=50, help="the top-k sampling measured beside greedy decoding")
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (medians)")
    p.add_argument("--out", default=os.path.join("results", "decoding"))
    args = p.parse_args(argv)
    for name in ("prompts", "prompt_tokens", "new_tokens", "top_k", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)} is out of range; allowed: an integer >= 1")
    if any(t < 1 for t in args.threads):
        p.error(f"--threads {args.threads}: allowed: integers >= 1")
    return args


def main(argv=None, log=print) -> Dict:
    """Convert the model's softmax to each of ``--heads`` and measure it (:func:`measure_head`); ``OUT/results.json``
    (resumable: a head already measured there is read, not measured again)."""
    from argparse import Namespace

    from hf_heads.cli import finetune

    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.json")
    done = runtime.load_json(path) or {"settings": vars(args), "heads": {}}
    for name in args.heads:
        if name in done["heads"]:
            continue
        source = Namespace(model=args.model, gguf_file=None, revision=None, trust_remote_code=False, tokenizer=None)
        model, tokenizer = finetune.load_model_and_tokenizer(source)
        model = hf_heads.convert_head(model.eval(), name)
        done["heads"][name] = measure_head(model, tokenizer, args, log)
        runtime.save_json(path, done)
    return done


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
