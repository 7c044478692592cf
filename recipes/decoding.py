"""What a fast head buys at decoding time, and how far it moves the text (issue 79's decoding study): the
measurements, on any head and any ``generate``-like function, kept apart from the models they run on.

Agreement, measured so that one early divergence does not decide it:

* :func:`top1_agreement`: teacher forcing on test text, the share of positions whose fast top-1 (the head's ``topk``
  through :func:`hf_heads.fast_decoding`) is the full softmax's;
* :func:`topk_total_variation`: top-k sampling, the total-variation distance between the full softmax's
  distribution renormalised over its top k and the fast head's over its own (0: the same sampler);
* :func:`greedy_prefix`: free-running greedy decoding, the length of the identical prefix per prompt.

Speed (:func:`decode_speed`): decode-only tokens per second at batch 1, prefill timed apart (a run of one new token),
the full and the fast path in interleaved rounds, medians. :func:`lstm_decode` is the LSTM LM's decoding loop (the
study's WikiText-2 and PTB LMs, :class:`recipes.common.hidden_tasks.LSTMLM`), greedy or top-k sampling, through the
head's fast path or its full softmax."""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

import hf_heads


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
