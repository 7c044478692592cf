"""The perplexity tables (Mixtape paper Table 3, PLIF paper): the papers' AWD-LSTM (``--arch head_awd_lstm_lm``)
with each head, trained with NT-ASGD and scored by ``fairseq-eval-lm`` on the averaged weights (full size).

* ``--scale mini`` (a 2-core CPU): the standard splits (``train.txt`` trains, or a stated prefix of it;
  ``valid.txt`` validates: the rate, the checkpoint, the stopping rule; ``test.txt`` tests) with the papers'
  protocol (``--task awd_language_modeling``: streams, the state carried, BPTT lengths drawn; scored with the state
  carried, 10 streams valid / 1 test); a scaled-down AWD-LSTM (:data:`MINI_MODEL`) with the optimiser the pilot
  chose (:mod:`recipes.reproduce.pilots.lm_pilot`, :data:`MINI_OPTIMIZERS`), under the stopping rule; scored on its
  best checkpoint (NT-ASGD: the averaged weights that validated best).
* ``--scale full``: the MoS settings (``head_awd_lstm_lm_ptb`` / ``_wt2``, 1000 epochs, NT-ASGD) on the standard
  splits; ``--dry-run`` prints the commands and each model's parameter count.

Each (head, seed) cell: ``fairseq-train`` -> (full: ``python -m fairseq_plugin.average``, the NT-ASGD averages, as
AWD-LSTM evaluates) -> ``fairseq-eval-lm`` on the valid and test splits. No dynamic evaluation, no finetune stage.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from recipes.reproduce.data import prepare as data_prep
from recipes.reproduce.engine import results as result_files
from recipes.reproduce.data.lm_corpora import CORPORA as LM_CORPORA, full_dir
from recipes.reproduce.engine.runner import PLUGIN, Runner, shell_line, tool, training_done
from recipes.reproduce.engine.sweep import StopRule
from recipes.reproduce.engine.table import Table
from recipes.reproduce.engine.variants import Variant, full_mixtape_form, mixtape_forms, resolve

#: the mini AWD-LSTM: smaller layers, half the MoS settings' dropouts (set for the earlier valid-split tables, kept)
MINI_MODEL = [
    "--emsize",
    "200",
    "--nhid",
    "400",
    "--nhidlast",
    "300",
    "--dropout",
    "0.2",
    "--dropouth",
    "0.1",
    "--dropouti",
    "0.2",
    "--dropoute",
    "0.05",
    "--wdrop",
    "0.25",
    "--dropoutl",
    "0.15",
]
#: the mini optimisers the pilot compares (:mod:`recipes.reproduce.pilots.lm_pilot`): Adam at a fixed rate, or the
#: papers' NT-ASGD (SGD at a constant rate, averaging from the non-monotone trigger; validated and scored on the
#: averages)
MINI_OPTIMIZERS = {
    "adam": ["--optimizer", "adam", "--adam-betas", "(0.9, 0.999)", "--lr-scheduler", "fixed"],
    "ntasgd": ["--optimizer", "ntasgd", "--lr-scheduler", "ntasgd", "--nonmono", "5"],
}
#: the centre of each optimiser's learning-rate grid (NT-ASGD: the MoS code's PTB rate)
MINI_LRS = {"adam": 0.005, "ntasgd": 20.0}
#: NT-ASGD's patience must outlast its trigger (--nonmono 5) by a few epochs of averaging, or every cell stops first.
#: Adam's cap is the budget's: an epoch of PTB train costs softmax about 7 CPU-minutes and MoS-4 about 18 here (the
#: pilot), so lm-ptb's 36 cells (24 at the chosen rates, 12 more in the sweep) fit 40 CPU-hours at 5 epochs beside
#: lm-wt2 and the pilot; cells at the cap are reported so
MINI_STOPS = {"adam": StopRule(patience=3, max_epochs=5), "ntasgd": StopRule(patience=8, max_epochs=40)}
#: streams a training batch (AWD-LSTM's PTB batch; MoS's is 12)
MINI_BATCH = 20
#: the papers' options of the heads on language modelling: Mixtape r = 0.1 with weight-normalised gates (in Mesh
#: TensorFlow's form, the mini tables' `mixtape` rows: MIXTAPE_FORMS), PLIF 1e5 knots (the PLIF paper), MoS-with-PLIF
#: as the PLIF paper's last row
LM_HEAD_OPTIONS = {
    "mixtape": {
        "num_gates": 4,
        "frequent_fraction": 0.1,
        "gate_weight_norm": True,
        "gate_noise": 0.1,
        "scaled_input": True,
    },
    "plif": {"num_knots": 100000},
    "mos_plif": {"num_components": 15, "num_knots": 100000},
}
#: (no mixtape-unscaled: at full size every Mixtape row runs that form, :data:`FULL_MIXTAPE_FORM`)
FULL_HEADS = [
    "softmax",
    "mos-3",
    "mos-5",
    "mos-10",
    "mos-15",
    "mixtape",
    "mixtape-noshare",
    "plif",
    "sigsoftmax",
    "mos_plif",
]
#: mini: softmax, softmax on a larger LSTM sized to MoS's count (``softmax-matched``), MoS-4, Mixtape in the
#: library's default form sized to MoS's count, PLIF, Sigsoftmax (PLIF and Sigsoftmax on softmax's model, as their
#: papers compare); the other rows are in the full plans
MINI_HEADS = ["softmax", "softmax-matched", "mos-4", "mixtape-unscaled", "plif", "sigsoftmax"]
#: the heads whose papers' numbers come from AWD-LSTM's own sizes (the PLIF paper's softmax -> PLIF rows, the MoS
#: paper's AWD-LSTM baseline that Mixtape's Table 3 softmax reproduces); MoS, Mixtape and MoS + PLIF run the MoS model
AWD_HEADS = ("softmax", "plif", "sigsoftmax")
#: why the full-size plans run Mixtape with scaled_input=False (in the note of every plan with a Mixtape row)
FULL_MIXTAPE_FORM = full_mixtape_form("the plans' NT-ASGD (SGD)", "d1 (the last layer's units)")
PPL = re.compile(r"Perplexity: ([\d.]+)")
#: how every full-size language-model plan trains and differs from the papers' code
FULL_NOTE = (
    "Trained and scored as the papers' code (--task awd_language_modeling: contiguous streams, the LSTM state "
    "carried from window to window, BPTT lengths drawn as the papers draw them with the learning rate "
    "scaled by them; evaluation over the whole split, batch 10 valid / 1 test). No finetune stage, no "
    "dynamic evaluation. Once NT-ASGD averages, validation reads the averages (as AWD-LSTM swaps them in), "
    "and the averaged weights that validated best are scored."
)


def prepare_mini_corpus(runner: Runner, args, table_dir: str, corpus: str, limit: int = 0) -> str:
    """The corpus of ``corpus`` (:func:`recipes.reproduce.data.prepare_lm`: the first ``limit`` lines of train.txt,
    or all of it; valid.txt and test.txt whole, or their first ``--limit`` lines, the tests' knob; the whole train
    split's vocabulary) under ``table_dir/data``, made again when either changes; returns its ``raw`` directory."""
    eval_limit = getattr(args, "limit", 0) or 0
    prep = os.path.join(table_dir, "data")
    raw = os.path.join(prep, "raw")
    marker = os.path.join(prep, "corpus.json")
    wanted = {"corpus": corpus, "limit": limit, "eval_limit": eval_limit, "train": "train.txt"}
    if result_files.load_json(marker) != wanted:
        if os.path.isdir(prep):
            shutil.rmtree(prep)
        lines = (["--limit", str(limit)] if limit else []) + (["--eval-limit", str(eval_limit)] if eval_limit else [])
        runner.run(
            [
                sys.executable,
                "-m",
                "recipes.reproduce.data.prepare",
                "lm",
                "--data",
                args.data,
                "--corpus",
                corpus,
                *lines,
                "--out",
                prep,
            ],
            os.path.join(prep, "prepare.log"),
            "data",
            comment=f"data: {corpus} train.txt"
            + (f" (first {limit} lines)" if limit else "")
            + ", valid.txt, test.txt",
        )
        result_files.save_json(marker, wanted)
    return raw


def checkpoint_parameters(path: str) -> int:
    """Parameters of the model a fairseq checkpoint holds: its ``model`` tensors, a tied weight (one storage under
    several keys: AWD-LSTM's embedding is its softmax's weight) counted once."""
    import torch

    state = torch.load(path, map_location="cpu", weights_only=False)
    unique = {t.data_ptr(): t.numel() for t in state["model"].values() if torch.is_tensor(t)}
    return int(sum(unique.values()))


def with_options(base: Sequence[str], extra: Sequence[str]) -> List[str]:
    """The option list ``base`` with each ``--name value`` of ``extra`` replacing ``base``'s value of that option
    in place (appended when ``base`` has none)."""
    out = list(base)
    for name, value in zip(extra[::2], extra[1::2]):
        if name in out:
            out[out.index(name) + 1] = value
        else:
            out += [name, value]
    return out


def data_options(streams: bool, delta: int, batch: int, chunks: int) -> List[str]:
    """fairseq-train's task and batching: the papers' streams (``--task awd_language_modeling``, 70-token BPTT with
    their length jitter ``delta``, ``batch`` streams in ``chunks`` accumulated pieces), or fairseq's 70-token blocks
    (the protocol study's other arm). The first two words are the task."""
    if streams:
        return ["--task", "awd_language_modeling", "--bptt", "70", "--max-seq-len-delta", str(delta)] + [
            "--batch-size", str(batch // chunks), "--update-freq", str(chunks)
        ]  # fmt: skip
    return ["--task", "language_modeling", "--tokens-per-sample", "70", "--batch-size", str(batch)] + [
        "--required-batch-size-multiple", "1"
    ]  # fmt: skip


@dataclass
class LanguageModelTable(Table):
    """One perplexity table: a corpus, the paper's numbers, the MoS preset for its full size."""

    counts_epochs = True

    name: str
    corpus: str
    description: str
    #: the papers' perplexities: {split: {head: ppl}}, each head's from one paper (:attr:`paper_source`)
    paper: Dict[str, Dict[str, float]]
    full_arch: str
    full_batch: int
    full_lr: float
    #: MoS's small batches at full size: the full batch's streams in this many chunks (--update-freq), and its cap
    #: on drawn windows (bptt + delta): WikiText-2 runs --batch_size 15 --small_batch_size 5 --max_seq_len_delta 20
    full_chunks: int = 1
    full_max_seq_len_delta: int = 40
    #: the model of the rows whose paper numbers come from AWD-LSTM itself (:data:`AWD_HEADS`): its arch, batch and
    #: learning rate (awd-lstm-lm's own code: no cap on the drawn windows); None: every row trains the MoS model
    full_awd: Optional[Dict[str, Any]] = None
    #: model options of some rows at full size, by registry head (lm-1b: the sizes that give MoS its paper's count)
    full_model_options: Dict[str, List[str]] = field(default_factory=dict)
    #: which paper each head's numbers come from, by head name ("*": the others), when the table cites several
    paper_source: Dict[str, str] = field(default_factory=dict)
    #: each head's claimed test difference from softmax in its paper, relative (``{"relative": -0.019, "source":
    #: "..."}``): the report puts it on our scale beside what the seeds can detect
    paper_claims: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    #: lines of train.txt the mini cells train on (0: all of it; valid.txt and test.txt are read whole)
    mini_lines: int = 0
    #: the tokens of those lines, one <eos> a line (what the report states; a test counts them in the data)
    mini_tokens: int = 0
    #: the heads of ``--scale mini`` (variant names)
    mini_heads: List[str] = field(default_factory=lambda: list(MINI_HEADS))
    #: seeds of each mini head at its chosen learning rate, fixed before the runs (others 1)
    mini_seeds: Dict[str, int] = field(default_factory=lambda: {"softmax": 3})
    #: the mini optimiser (a key of :data:`MINI_OPTIMIZERS`), chosen by the pilot
    mini_optimizer: str = "adam"
    #: model options of some mini rows, by variant name, over :data:`MINI_MODEL` (the size-matched rows)
    mini_model_options: Dict[str, List[str]] = field(default_factory=dict)
    #: the cell whose checkpoint another study reads (:attr:`Table.keep_cell`)
    keep_cell: Optional[tuple] = None
    paper_costs: Dict[str, Dict[str, float]] = field(default_factory=dict)
    full_epochs: int = 1000
    #: the heads of ``--scale full`` (default :data:`FULL_HEADS`)
    full_heads: List[str] = field(default_factory=lambda: list(FULL_HEADS))
    #: what the full-size plan assumes beyond :data:`FULL_NOTE` (printed by --dry-run, shown in the report)
    full_note: str = ""
    scales: tuple = ("mini", "full")
    metric = "ppl"
    max_rates = 3  # the grid (MINI_LRS's centre, x2 and /2) is not grown past a best end: the budget
    cost_batch = 48  # Table 3's same-batch columns: 48 sequences
    cost_unit = "blocks of 70 tokens"

    def variants(self, args) -> List[Variant]:
        options = LM_HEAD_OPTIONS
        if args.scale == "full":  # the form that trains under the plans' NT-ASGD (FULL_MIXTAPE_FORM)
            options = {**options, "mixtape": {**options["mixtape"], "scaled_input": False}}
        return resolve(args.heads or (self.mini_heads if args.scale == "mini" else self.full_heads), options)

    @property
    def mini_stop(self) -> StopRule:
        return MINI_STOPS[self.mini_optimizer]

    @property
    def mini_lr(self) -> float:
        return MINI_LRS[self.mini_optimizer]

    def mini_model(self, variant: Variant) -> List[str]:
        """The mini model options of ``variant``'s row: :data:`MINI_MODEL` with its own sizes
        (:attr:`mini_model_options`) in place."""
        return with_options(MINI_MODEL, self.mini_model_options.get(variant.name, []))

    def dataset(self, args) -> str:
        return self.corpus

    @property
    def report_notes(self) -> str:
        if "mini" not in self.scales:
            return ""
        train = (
            f"the first {self.mini_lines} lines of train.txt ({self.mini_tokens:,} tokens with their <eos>)"
            if self.mini_lines
            else "train.txt"
        )
        seeds = ", ".join(f"{h} {n}" for h, n in self.mini_seeds.items())
        sized = "; ".join(f"{name}: {' '.join(options)}" for name, options in self.mini_model_options.items())
        return (
            f"Mini: {train} trains, valid.txt validates (the rate, the checkpoint, the stopping rule), test.txt "
            f"tests, the vocabulary of the whole train split. The papers' protocol (--task "
            f"awd_language_modeling: {MINI_BATCH} streams, the state carried, BPTT lengths drawn; scored with the "
            f"state carried over the split, 10 streams valid / 1 test). An AWD-LSTM of {' '.join(MINI_MODEL)}"
            + (f" ({sized})" if sized else "")
            + f", {' '.join(MINI_OPTIMIZERS[self.mini_optimizer])} "
            f"(the pilot's choice), {self.mini_stop.describe()}. Seeds per head, fixed before the runs: {seeds}."
            + (f" {mixtape_forms(self.mini_heads)}" if mixtape_forms(self.mini_heads) else "")
        )

    def paper_for(self, variant: Variant, split: str) -> Optional[float]:
        return self.paper.get(split, {}).get(variant.name)

    def epochs(self, args) -> int:
        """Epochs of a full-size cell (``--max-epochs``, default the paper's), or the cap of a mini cell's stopping
        rule (``--max-epochs``, default the table's; with ``--patience 0``, the epochs it trains)."""
        given = getattr(args, "max_epochs", None)
        return given or (self.full_epochs if args.scale == "full" else self.mini_stop.max_epochs)

    def lines(self, args) -> int:
        """Lines of train.txt the mini corpus reads (``--limit`` of the tests, else :attr:`mini_lines`; 0: all)."""
        return args.limit or self.mini_lines

    def cell_config(self, variant: Variant, seed: int, args, lr: Optional[float] = None) -> Dict[str, Any]:
        config = {
            "table": self.name,
            "head": variant.name,
            "options": variant.options,
            "seed": seed,
            "scale": args.scale,
            "updates": self.epochs(args),
            "limit": self.lines(args),
        }
        if args.scale == "mini":  # cells trained with other mini settings are trained again
            config.update(
                self.mini_config(args, lr),
                data="train.txt",
                protocol="streams",
                batch=MINI_BATCH,
                mini=self.mini_model(variant) + MINI_OPTIMIZERS[self.mini_optimizer],
            )
        return config

    # -- commands ----------------------------------------------------------------------------
    def train_command(
        self,
        bin_dir: str,
        variant: Variant,
        seed: int,
        save_dir: str,
        args,
        lr: Optional[float] = None,
        streams: bool = True,
        optimizer: Optional[str] = None,
    ) -> List[str]:
        """The length is in epochs here (:meth:`epochs`: the papers train LMs for a number of epochs; mini: the cap
        of the stopping rule). ``lr``: a mini cell's rate (default the grid's centre). ``streams``: the papers' protocol
        (``--task awd_language_modeling``, every table's) or fairseq's blocks (the protocol study's other arm).
        ``optimizer``: a mini cell's (a key of :data:`MINI_OPTIMIZERS`; default the table's; the pilot runs
        both)."""
        full = args.scale == "full"
        optimizer = optimizer or self.mini_optimizer
        model = (
            self.full_model_options.get(variant.name, self.full_model_options.get(variant.head, []))
            if full
            else self.mini_model(variant)
        )
        arch, batch, full_lr, chunks, delta = self.full_model(variant if full else None)
        if not full:
            batch, chunks = MINI_BATCH, 1
        schedule = (
            ["--optimizer", "ntasgd", "--lr-scheduler", "ntasgd", "--nonmono", "5", "--lr", str(full_lr)]
            if full
            else [*MINI_OPTIMIZERS[optimizer], "--lr", f"{lr or MINI_LRS[optimizer]:g}"]
        )
        rule = None if full else self.stop_rule(args)
        length = [*(["--patience", str(rule.patience)] if rule else []), "--max-epoch", str(self.epochs(args))]
        untie = ["--untie-weights"] if variant.head in ("ds_softmax", "d_softmax") else []
        data = data_options(streams, delta, batch, chunks)
        return [
            tool("fairseq-train"),
            bin_dir,
            "--user-dir",
            PLUGIN,
            *data[:2],
            "--arch",
            arch,
            *model,
            *untie,
            "--output-head",
            variant.head,
            "--head-options",
            json.dumps(variant.options, sort_keys=True),
            "--criterion",
            "head_cross_entropy",
            *schedule,
            "--clip-norm",
            "0.25",
            "--weight-decay",
            "1.2e-6",
            *data[2:],
            *length,
            "--seed",
            str(seed),
            "--save-dir",
            save_dir,
            "--no-epoch-checkpoints",
            "--log-format",
            "json",
            "--log-interval",
            "20",
            "--num-workers",
            "0",
            *(["--cpu"] if not full else []),
        ]

    def full_model(self, variant: Optional[Variant]):
        """``(arch, batch, lr, chunks, max_seq_len_delta)`` of a row at full size: AWD-LSTM's own model for the rows
        whose paper numbers come from it (:data:`AWD_HEADS`), else (and for ``variant=None``: the mini cells, which
        scale it down) the MoS model."""
        if self.full_awd and variant is not None and variant.head in AWD_HEADS:
            a = self.full_awd
            return a["arch"], a["batch"], a["lr"], 1, -1
        return self.full_arch, self.full_batch, self.full_lr, self.full_chunks, self.full_max_seq_len_delta

    def data_command(self, args) -> str:
        return shell_line(
            [sys.executable, "-m", "recipes.reproduce.data.lm_corpora", "--corpus", self.corpus, "--data", args.data]
        )

    def eval_command(self, bin_dir: str, checkpoint: str, split: str, args, scoring: Optional[str] = None) -> List[str]:
        """``fairseq-eval-lm`` of ``checkpoint`` on ``split``; ``scoring``: ``"stateful"`` (the papers', the default:
        the state carried over the whole split, 10 streams for valid / 1 for test), ``"stateless"`` (the same windows
        from a zero state each) or ``"blocks"`` (fairseq's language_modeling: blocks of 70, batch 10)."""
        scoring = scoring or "stateful"
        cpu = ["--cpu"] if args.scale == "mini" else []
        if scoring == "blocks":
            return [
                tool("fairseq-eval-lm"),
                bin_dir,
                "--user-dir",
                PLUGIN,
                "--path",
                checkpoint,
                "--gen-subset",
                split,
                "--tokens-per-sample",
                "70",
                "--batch-size",
                "10",
                "--num-workers",
                "0",
                *cpu,
            ]
        return [
            tool("fairseq-eval-lm"),
            bin_dir,
            "--user-dir",
            PLUGIN,
            "--task",
            "awd_language_modeling",
            "--bptt",
            "70",
            *(["--stateless"] if scoring == "stateless" else []),
            "--path",
            checkpoint,
            "--gen-subset",
            split,
            "--num-workers",
            "0",
            *cpu,
        ]

    # -- data --------------------------------------------------------------------------------
    def prepare(self, runner: Runner, args, table_dir: str) -> Dict[str, Any]:
        if args.scale == "full":
            bin_dir = os.path.join(full_dir(args.data, self.corpus), "bin")
            if not os.path.isfile(os.path.join(bin_dir, "dict.txt")):
                raise data_prep.missing_files_error(
                    bin_dir,
                    ["dict.txt"],
                    f"{self.name} --scale full (prepare the data "
                    f"first, on a machine with internet: {self.data_command(args)})",
                )
            return {"bin": bin_dir}
        prep = os.path.join(table_dir, "data")
        bin_dir = os.path.join(prep, "bin")
        done = os.path.join(prep, "done.json")
        raw = prepare_mini_corpus(runner, args, table_dir, self.corpus, self.lines(args))
        if not os.path.isfile(done):
            runner.run(
                [
                    tool("fairseq-preprocess"),
                    "--only-source",
                    "--srcdict",
                    os.path.join(prep, "dict.txt"),
                    "--trainpref",
                    os.path.join(raw, "train.txt"),
                    "--validpref",
                    os.path.join(raw, "valid.txt"),
                    "--testpref",
                    os.path.join(raw, "test.txt"),
                    "--destdir",
                    bin_dir,
                    "--workers",
                    "2",
                ],
                os.path.join(prep, "prepare.log"),
                "data",
            )
            result_files.save_json(done, {"limit": self.lines(args)})
        return {"bin": bin_dir}

    def plan(self, variants, args, table_dir: str, log=print) -> Dict[str, Any]:
        from recipes.reproduce.engine.costs import count_parameters
        import tempfile

        bin_dir = os.path.join(full_dir(args.data, self.corpus), "bin")
        commands, parameters = [self.data_command(args)], {}
        for v in variants:
            cell = os.path.join(table_dir, v.name, "seed1")
            commands += [
                shell_line(self.train_command(bin_dir, v, 1, os.path.join(cell, "checkpoints"), args)),
                shell_line(self.average_command(os.path.join(cell, "checkpoints"), cell)),
            ]
            commands += [
                shell_line(self.eval_command(bin_dir, os.path.join(cell, "averaged.pt"), s, args))
                for s in ("valid", "test")
            ]
            with tempfile.TemporaryDirectory() as tmp:
                vocab = LM_CORPORA[self.corpus]["vocab"]  # the standard vocabularies
                with open(os.path.join(tmp, "dict.txt"), "w") as f:
                    f.write("".join(f"w{i} {vocab - i}\n" for i in range(vocab - 4)))
                parameters[v.name] = count_parameters(self.train_command(tmp, v, 1, tmp, args)[1:])
            log(f"{self.name} {v.name}: {parameters[v.name] / 1e6:.1f}M parameters")
        note = f"{self.full_note} {FULL_NOTE}".strip()
        if self.full_awd:
            awd = [v.name for v in variants if v.head in AWD_HEADS]
            note += (
                (
                    f" {', '.join(awd)} train AWD-LSTM's own model ({self.full_awd['arch']}: batch "
                    f"{self.full_awd['batch']}, lr {self.full_awd['lr']:g}, no cap on the drawn windows, as "
                    f"salesforce/awd-lstm-lm), the model their paper numbers come from; the others the MoS model "
                    f"({self.full_arch})."
                )
                if awd
                else ""
            )
        if any(v.head == "mixtape" for v in variants):
            note += " " + FULL_MIXTAPE_FORM
        mos = [h for h in parameters if h.startswith("mos-")]
        if "mixtape" in parameters and mos:  # the Mixtape paper tunes Mixtape's size to MoS's count
            sized = self.full_model_options.get("mixtape")
            note += (
                f" Mixtape has {parameters['mixtape'] / parameters[mos[-1]]:.1%} of {mos[-1]}'s parameters"
                + (
                    f" ({' '.join(sized)}; the paper makes them equal without saying which size it changed)"
                    if sized
                    else ""
                )
                + "."
            )
        paper = {
            v.name: {split: self.paper_for(v, split) for split in ("valid", "test") if self.paper_for(v, split)}
            for v in variants
        }
        result = {
            "commands": commands,
            "parameters": parameters,
            "note": note,
            "paper": {h: by_split for h, by_split in paper.items() if by_split},
        }
        result_files.save_json(os.path.join(table_dir, "plan.json"), result)
        return result

    # -- one cell ----------------------------------------------------------------------------
    def train_cell(
        self,
        runner: Runner,
        prepared,
        variant: Variant,
        seed: int,
        args,
        table_dir: str,
        label: str,
        lr: Optional[float] = None,
    ) -> Dict[str, Any]:
        cell_dir = result_files.cell_dir(table_dir, variant.name, seed, lr)
        save_dir = self.checkpoint_dir(table_dir, variant, seed, lr)
        log_path = os.path.join(cell_dir, "train.log")
        train = self.train_command(prepared["bin"], variant, seed, save_dir, args, lr)
        commands = [shell_line(train)]
        if not training_done(log_path):
            runner.run(train, log_path, label, comment=f"{label}: train")
        if self.averages(args):  # NT-ASGD: score the averages that validated best, as AWD-LSTM does
            average = self.average_command(save_dir, cell_dir)
            runner.run(average, log_path, label, comment=f"{label}: the NT-ASGD averages")
            commands.append(shell_line(average))
        record = self.trained_record(table_dir, variant, seed, args, log_path, commands, lr)
        best = os.path.join(save_dir, "checkpoint_best.pt")
        if os.path.isfile(best):  # the row's size, as the report states it
            record["parameters"] = checkpoint_parameters(best)
            result_files.save_json(result_files.cell_path(table_dir, variant.name, seed, lr), record)
        return record

    def averages(self, args) -> bool:
        """Whether this run's cells train with NT-ASGD, so their averaged weights are scored."""
        return args.scale == "full" or self.mini_optimizer == "ntasgd"

    @staticmethod
    def average_command(save_dir: str, cell_dir: str) -> List[str]:
        """``checkpoint_best.pt`` with its NT-ASGD averages as the weights (the weights it validated with), written
        to ``CELL/averaged.pt``."""
        return [
            sys.executable,
            "-m",
            "fairseq_plugin.average",
            os.path.join(save_dir, "checkpoint_best.pt"),
            os.path.join(cell_dir, "averaged.pt"),
        ]

    def score_cell(
        self,
        runner: Runner,
        prepared,
        variant: Variant,
        seed: int,
        args,
        table_dir: str,
        label: str,
        record: Dict[str, Any],
    ):
        """Perplexity of the averaged weights (NT-ASGD) or the best checkpoint (Adam) on valid and test."""
        lr = record.get("lr") if args.scale == "mini" else None
        cell_dir = result_files.cell_dir(table_dir, variant.name, seed, lr)
        scored = (
            os.path.join(cell_dir, "averaged.pt")
            if self.averages(args)
            else os.path.join(self.checkpoint_dir(table_dir, variant, seed, lr), "checkpoint_best.pt")
        )
        return self.score_checkpoint(runner, prepared["bin"], scored, cell_dir, label, args)

    def score_checkpoint(
        self, runner: Runner, bin_dir: str, checkpoint: str, cell_dir: str, label: str, args
    ) -> Tuple[Dict[str, float], List[str]]:
        """Perplexity of ``checkpoint`` on valid and test, as the table scores (logs in ``cell_dir``), and the
        commands that scored it."""
        ppl, commands = {}, []
        for split in ("valid", "test"):
            cmd = self.eval_command(bin_dir, checkpoint, split, args)
            out = runner.run(cmd, os.path.join(cell_dir, f"eval-{split}.log"), label, comment=f"{label}: {split}")
            found = PPL.findall(out)
            if not found:
                raise SystemExit(f"cell {label}: no perplexity in {os.path.join(cell_dir, f'eval-{split}.log')}")
            ppl[split] = float(found[-1])
            commands.append(shell_line(cmd))
        return ppl, commands

    def remove_checkpoints(self, table_dir: str, variant: Variant, seed: int, lr: Optional[float] = None) -> None:
        super().remove_checkpoints(table_dir, variant, seed, lr)
        averaged = os.path.join(result_files.cell_dir(table_dir, variant.name, seed, lr), "averaged.pt")
        if os.path.exists(averaged):
            os.remove(averaged)
