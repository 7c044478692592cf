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
study's WikiText-2 and PTB LMs, :class:`studies.common.hidden_tasks.LSTMLM`), greedy or top-k sampling, through the
head's fast path or its full softmax."""

from __future__ import annotations

import argparse
import contextlib
import copy
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
from studies.common import lms


@torch.no_grad()
def top1_agreement(head, hidden: torch.Tensor, reference=None) -> float:
    """The share of the states ``hidden`` ``[N, d]`` whose top-1 through the head's fast path is the full softmax's
    (``reference``'s, the trained softmax a head was converted from; the head's own full forward when None)."""
    full = (reference or head)(hidden).argmax(-1)
    with hf_heads.fast_decoding(head, k=1):
        fast = head(hidden).argmax(-1)
    return float((fast == full).double().mean())


@torch.no_grad()
def topk_total_variation(head, hidden: torch.Tensor, k: int, reference=None) -> List[float]:
    """Per state of ``hidden`` ``[N, d]``: the total-variation distance between top-k sampling from the full softmax
    (``reference``'s, else the head's own full forward: its k most probable ids, renormalised) and from the fast path
    (the head's own top k, renormalised)."""
    full = (reference or head)(hidden).float()
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
    out, state = body.run(prompt)
    ids = [prompt]
    with hf_heads.fast_decoding(head, k=top_k or 1) if fast else contextlib.nullcontext():
        for _ in range(new_tokens):
            log_probs = head(out[:, -1])
            if top_k is None:
                step = log_probs.argmax(-1, keepdim=True)
            else:
                top = log_probs.topk(top_k, dim=-1)
                pick = torch.multinomial(torch.softmax(top.values, dim=-1), 1, generator=generator)
                step = top.indices.gather(-1, pick)
            ids.append(step)
            out, state = body.run(step, state)
    return torch.cat(ids, dim=1)


def lstm_generate(body, head, top_k: Optional[int] = None, seed: int = 0, reference=None):
    """``generate(prompt, fast, n)`` for :func:`greedy_prefix` / :func:`decode_speed` on the LSTM LM: exactly ``n``
    new tokens through :func:`lstm_decode`, greedy (``top_k`` None) or top-k sampling with a fixed seed; ``fast``
    through the head's fast path, else through ``reference`` (the full softmax; the head's own full forward when
    None)."""

    def generate(prompt, fast, n=64):
        h = head if fast or reference is None else reference
        return lstm_decode(body, h, prompt, n, fast, top_k, torch.Generator().manual_seed(seed))

    return generate


# ----------------------------------------------------------------------------------- the command


def read_ids(tokenizer, path: str, limit: int) -> torch.Tensor:
    """The first ``limit`` token ids of the text at ``path`` (its lines joined as the file has them)."""
    with open(path) as f:
        text = f.read(limit * 16)  # enough characters for ``limit`` tokens of English text
    ids = tokenizer(text, return_tensors="pt").input_ids[0]
    if len(ids) < limit:
        raise ValueError(f"--text {path}: {len(ids)} tokens in its first {limit * 16} characters, {limit} needed")
    return ids[:limit]


def hf_generate(model, pad_id: int, top_k: Optional[int] = None, seed: int = 0, reference=None):
    """``generate(prompt, fast, n)`` for :func:`greedy_prefix` / :func:`decode_speed`: exactly ``n`` new tokens, greedy
    (``top_k`` None) or top-k sampling with a fixed seed, through the head's fast path with ``fast``, else through
    ``reference`` (the model before its head was converted; ``model``'s own full forward when None)."""

    def generate(prompt, fast, n=64):
        kwargs = dict(max_new_tokens=n, min_new_tokens=n, pad_token_id=pad_id, do_sample=top_k is not None)
        if top_k is not None:
            kwargs.update(top_k=top_k, top_p=1.0)
        torch.manual_seed(seed)
        if not fast and reference is not None:
            return reference.generate(prompt, **kwargs)
        with hf_heads.fast_decoding(model, k=top_k or 1) if fast else contextlib.nullcontext():
            return model.generate(prompt, **kwargs)

    return generate


def head_share(head, hidden: torch.Tensor, decode_s_per_token: float, rounds: int = 7) -> float:
    """The share of one decoding step's time spent in the head's full forward on ``hidden`` (one position, batch 1)."""
    with torch.no_grad():
        times = []
        for _ in range(rounds + 1):
            start = time.perf_counter()
            head(hidden)
            times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) / decode_s_per_token


def measure(
    head, hidden: torch.Tensor, prompts: List[torch.Tensor], make_generate: Callable, args, log=print, reference=None
) -> Dict:
    """One head: agreement with the full softmax ``reference`` (the head's own full forward when None) on the states
    ``hidden`` of test text under teacher forcing (top-1, top-k TV), greedy prefixes over ``prompts``, and, per thread
    count, prefill and decode speed of greedy and top-k sampling through its fast path against the full softmax
    (``make_generate(top_k)``: a ``generate(prompt, fast, n)``), with the share of a full-softmax decoding step in the
    full softmax and the load average before and after."""
    greedy = make_generate(None)
    out: Dict = {
        "teacher_forced_top1_agreement": top1_agreement(head, hidden, reference),
        "top_k": args.top_k,
        "top_k_tv": statistics.fmean(topk_total_variation(head, hidden, args.top_k, reference)),
        "greedy_prefix": greedy_prefix(lambda p, fast: greedy(p, fast, args.new_tokens), prompts),
        "speed": {},
    }
    threads_before = torch.get_num_threads()
    try:
        for threads in args.threads:
            torch.set_num_threads(threads)
            row = {"load_before": os.getloadavg()[0]}
            for mode, top_k in (("greedy", None), (f"top-{args.top_k}", args.top_k)):
                row[mode] = decode_speed(make_generate(top_k), prompts[0], args.new_tokens, args.rounds)
            full_step = 1.0 / row["greedy"]["full"]["decode_tokens_per_s"]
            row["head_share_of_decode"] = head_share(reference or head, hidden[-1:], full_step)
            row["load_after"] = os.getloadavg()[0]
            out["speed"][str(threads)] = row
            log(f"{head.head_name}, {threads} thread(s): {json.dumps(row)}")
    finally:
        torch.set_num_threads(threads_before)
    return out


def measure_head(model, tokenizer, args, log=print, reference=None) -> Dict:
    """:func:`measure` on an HF model's head against ``reference`` (the model before its head was converted):
    prompts and teacher-forced states from the start of ``--text``."""
    ids = read_ids(tokenizer, args.text, args.prompts * args.prompt_tokens)
    prompts = list(ids.view(args.prompts, args.prompt_tokens)[:, None, :].unbind(0))
    pad = tokenizer.pad_token_id or tokenizer.eos_token_id or 0
    with torch.no_grad():
        hidden = body(model)(ids.view(args.prompts, args.prompt_tokens)).last_hidden_state.flatten(0, 1)
    full = None if reference is None else hf_heads.output_head(reference)
    make = lambda k: hf_generate(model, pad, k, reference=reference)  # noqa: E731
    return measure(hf_heads.output_head(model), hidden, prompts, make, args, log, full)


def measure_lstm(lstm, head, ids: torch.Tensor, args, log=print, reference=None) -> Dict:
    """:func:`measure` on the LSTM LM ``lstm`` with ``head`` against ``reference`` (its trained softmax): prompts and
    teacher-forced states from the test ids ``ids``."""
    n = args.prompts * args.prompt_tokens
    if len(ids) < n:
        raise ValueError(f"--prompts x --prompt-tokens = {n} test tokens, the text has {len(ids)}")
    chunks = ids[:n].view(args.prompts, args.prompt_tokens)
    with torch.no_grad():
        hidden = lstm(chunks).flatten(0, 1)  # each prompt from a zero state, as decoding starts
    prompts = list(chunks[:, None, :].unbind(0))
    make = lambda k: lstm_generate(lstm, head, k, args.seed, reference)  # noqa: E731
    return measure(head, hidden, prompts, make, args, log, reference)


#: ``--model``'s name for the study's WikiText-2 LSTM (:mod:`studies.common.lms`, read from ``--lm-dir``)
LSTM_MODEL = "wikitext-2-lstm"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="What a fast head buys at decoding time: speed and agreement")
    p.add_argument(
        "--model",
        default="smollm2",
        help=f"a local model folder, a Hub id, smollm2 (the shipped one) or {LSTM_MODEL} (the fast study's LSTM)",
    )
    p.add_argument("--text", default=os.path.join(data_paths.corpus("wikitext-2"), "test.txt"), help="prompts' text")
    p.add_argument(
        "--heads",
        nargs="*",
        default=["softmax", "svd_softmax", "adaptive_sampling"],
        help="heads converted from the trained softmax (softmax: the softmax itself, its top-k as the fast path)",
    )
    p.add_argument(
        "--head-dirs",
        nargs="*",
        default=[],
        help="trained heads (hf_heads.save_head folders of this model's sizes, e.g. the DS and SVD recipes' "
        "OUT/heads/*), each measured under its folder's name",
    )
    p.add_argument("--wt2-dir", default=data_paths.corpus("wikitext-2"), help=f"{LSTM_MODEL}: the text it read")
    p.add_argument("--lm-dir", default=lms.LM_DIR, help=f"{LSTM_MODEL}: where it was trained")
    p.add_argument("--prompts", type=int, default=100, help="prompts of --prompt-tokens tokens, from the text's start")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated after each prompt")
    p.add_argument("--top-k", type=int, default=50, help="the top-k sampling measured beside greedy decoding")
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (medians)")
    p.add_argument("--seed", type=int, default=0, help="top-k sampling's draws")
    p.add_argument("--out", default=os.path.join("results", "decoding"))
    args = p.parse_args(argv)
    for name in ("prompts", "prompt_tokens", "new_tokens", "top_k", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)} is out of range; allowed: an integer >= 1")
    if any(t < 1 for t in args.threads):
        p.error(f"--threads {args.threads}: allowed: integers >= 1")
    return args


def trained_head(folder: str, vocab_size: int, hidden_size: int):
    """The head saved in ``folder`` (:func:`hf_heads.save_head`), refused (``SystemExit`` naming it) when it was not
    trained for this model's sizes."""
    head = hf_heads.load_head(folder).eval()
    sizes = (head.config.vocab_size, head.config.hidden_size)
    if sizes != (vocab_size, hidden_size):
        raise SystemExit(
            f"--head-dirs {folder}: a head of V = {sizes[0]}, d = {sizes[1]}; this model's is V = {vocab_size}, "
            f"d = {hidden_size} (a head trained on another model's states?)"
        )
    return head


def with_trained_head(model, folder: str):
    """A copy of the HF ``model`` whose output layer is the head saved in ``folder`` (its weights as trained, the
    model's own untouched). A head that the swap ties to the input embedding (a softmax trained on a tied model's
    states, e.g. the DS recipe's control) is untied first: it was trained alone, the input embedding kept as it was,
    and loading it into the tied weight would move the embedding too."""
    weight = model.get_output_embeddings().weight
    head = trained_head(folder, *weight.shape)
    options = {k: v for k, v in head.config.to_dict().items() if k not in ("hidden_size", "vocab_size", "use_bias")}
    converted = hf_heads.swap_head(copy.deepcopy(model), head.head_name, **options)
    new = hf_heads.output_head(converted)
    if new.weight is converted.get_input_embeddings().weight:
        new.weight = torch.nn.Parameter(new.weight.detach().clone())
        converted.config.tie_word_embeddings = False  # nothing re-ties them later
    new.load_state_dict(head.state_dict())
    return converted.eval()


def described(head, model: str, extra: Dict) -> Dict:
    """What a measured head was: its name and options, the model, the dtype and the cache decoding used."""
    return {"head": head.head_name, "config": head.config.to_dict(), "model": model, "dtype": "float32", **extra}


def lstm_model(args):
    """The fast study's WikiText-2 LSTM and its softmax (read from ``--lm-dir``, else the checkout's kept copy; not
    trained here), the test ids, and what the LM is (its file, valid / test perplexity, best epoch)."""
    path = lms.trained_lm_path(args.lm_dir, "wikitext-2")
    if path is None:
        missing = lms.lm_path(args.lm_dir, "wikitext-2", lms.LSTM_SETTINGS)
        raise SystemExit(
            f"--model {LSTM_MODEL}: no LSTM at {missing} nor in {lms.KEPT_LMS}; train it: "
            f"python -m studies.common.lms --out {args.lm_dir}"
        )
    lstm, softmax, record = lms.train_split_lm(args.wt2_dir, "wikitext-2", args.lm_dir, progress=False)
    lm = {"path": path, **{k: record[k] for k in ("valid_ppl", "test_ppl", "best_epoch")}}
    return lstm, softmax, lms.split_ids(args.wt2_dir, lms.vocabulary(args.wt2_dir), "test"), lm


def main(argv=None, log=print) -> Dict:
    """Convert the model's softmax to each of ``--heads`` (and read ``--head-dirs``) and measure each against the
    softmax (:func:`measure_head`, :func:`measure_lstm`); ``OUT/results.json`` (resumable: a head already measured
    there is read, not measured again)."""
    from argparse import Namespace

    from hf_heads.cli import finetune

    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.json")
    done = runtime.load_json(path) or {"settings": vars(args), "heads": {}}
    trained = {os.path.basename(os.path.normpath(d)): d for d in args.head_dirs}
    todo = [name for name in [*args.heads, *trained] if name not in done["heads"]]
    if todo and args.model == LSTM_MODEL:
        lstm, softmax, ids, lm = lstm_model(args)
        cache = "the LSTM's recurrent state, carried from token to token"
    elif todo:  # the model once, every head a copy of it
        source = Namespace(model=args.model, gguf_file=None, revision=None, trust_remote_code=False, tokenizer=None)
        model, tokenizer = finetune.load_model_and_tokenizer(source)
        reference = hf_heads.convert_head(copy.deepcopy(model).eval(), "softmax")  # the trained softmax, as a head
        model.eval()
        cache = "transformers' KV cache (generate's default, use_cache)"
    for name in todo:
        with runtime.clock({}) as took:  # the head's conversion or reading and its measurements
            if args.model == LSTM_MODEL:
                V, d = softmax.weight.shape
                head = trained_head(trained[name], V, d) if name in trained else hf_heads.convert_head(softmax, name)
                result = measure_lstm(lstm, head.eval(), ids, args, log, reference=softmax)
                result.update(described(head, args.model, {"cache": cache, "lm": lm}))
            else:
                if name in trained:
                    converted = with_trained_head(model, trained[name])
                else:
                    converted = hf_heads.convert_head(copy.deepcopy(model), name)
                result = measure_head(converted, tokenizer, args, log, reference=reference)
                result.update(described(hf_heads.output_head(converted), args.model, {"cache": cache}))
        result.update(took)
        log(f"{name}: {took['seconds']:.0f} s ({took['cpu_seconds']:.0f} CPU s)")
        done["heads"][name] = result
        runtime.save_json(path, done)
    return done


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
