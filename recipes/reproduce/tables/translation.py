"""The translation tables (Mixtape paper, Tables 1, 5 and 6): a transformer with each head, trained and scored
through fairseq's own command line.

* ``--scale mini`` (a 2-core CPU): Multi30k from ``--data``, a joint sentencepiece BPE learned here, a small
  transformer (:data:`MINI_MODEL`) trained for a fixed number of updates per cell, beam 5, sacrebleu on the
  detokenized hypotheses of test_2016_flickr and test_2017_flickr; plus the paper's cost columns measured on
  this model (:mod:`recipes.reproduce.engine.costs`).
* ``--scale full`` (a GPU cluster): the paper's section 4.2 models on WMT'14 (data prepared on a machine with
  internet by :mod:`recipes.reproduce.data.wmt`); ``--dry-run`` prints the commands and counts every model's
  parameters on the meta device.

Each (head, seed) cell: ``fairseq-train`` (resumes from its ``checkpoint_last.pt`` when interrupted) ->
``fairseq-generate --beam 5 --post-process sentencepiece`` on every test set -> ``HEAD/seedK/TESTSET.hyp``
(detokenized, one line per source sentence, in test order) -> sacrebleu against the raw references.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from recipes.reproduce.data import prepare as data_prep
from recipes.reproduce.engine import results as result_files
from recipes.reproduce.data import wmt
from recipes.reproduce.engine.costs import count_parameters
from recipes.reproduce.engine.runner import PLUGIN, Runner, shell_line, tool, training_done
from recipes.reproduce.engine.sweep import StopRule
from recipes.reproduce.engine.table import Table
from recipes.reproduce.engine.variants import Variant, full_mixtape_form, resolve

#: the mini transformer: 3+3 layers, 128-d, pre-norm (stable at a high learning rate), shared embeddings
MINI_MODEL = [
    "--arch",
    "head_transformer",
    "--encoder-layers",
    "3",
    "--decoder-layers",
    "3",
    "--encoder-normalize-before",
    "--decoder-normalize-before",
    "--encoder-embed-dim",
    "128",
    "--decoder-embed-dim",
    "128",
    "--encoder-ffn-embed-dim",
    "256",
    "--decoder-ffn-embed-dim",
    "256",
    "--encoder-attention-heads",
    "4",
    "--decoder-attention-heads",
    "4",
    "--share-all-embeddings",
    "--dropout",
    "0.1",
]
#: its training schedule: Adam, inverse square root after a warm-up, batches of 1024 tokens, label smoothing 0.1; the
#: peak learning rate is swept per head (:data:`MINI_LR`). 1024 rather than 4096 tokens a batch: softmax at 5e-3 then
#: reaches a lower valid loss (3.560 at epoch 22, stopped at 24) than the best 4096-token cell of the sweep (1e-2:
#: 3.649 at epoch 23), passing it by epoch 15, for about the same CPU time an epoch (124 vs 137 CPU-seconds); the
#: warm-up is 4x longer (600 updates) so that it spans the same tokens
MINI_TRAIN = [
    "--optimizer",
    "adam",
    "--adam-betas",
    "(0.9, 0.98)",
    "--clip-norm",
    "0.0",
    "--lr-scheduler",
    "inverse_sqrt",
    "--warmup-updates",
    "600",
    "--warmup-init-lr",
    "1e-07",
    "--max-tokens",
    "1024",
    "--label-smoothing",
    "0.1",
]
#: the mini joint BPE vocabulary: 2k rather than 4k halves the K x V work of the mixture heads, which sets what a
#: converged mini cell costs on a CPU (V stays 16x d)
MINI_BPE = 2000
#: the centre of the mini learning-rate grid (x 1/2, 1, 2: 2.5e-3, 5e-3, 1e-2) and the stopping rule (epochs of
#: Multi30k: ~580 updates of 1024 tokens). With 1024-token batches 1e-2 trails 5e-3 (valid loss 3.768 vs 3.691 at
#: epoch 11, seed 1)
MINI_LR = 0.005
MINI_STOP = StopRule(patience=2, max_epochs=25)
#: published text-only systems trained on the same 29k Multi30k pairs, per target language: what a converged small
#: model reaches (read in the authors' repositories' READMEs, lium-lst/wmt17-mmt and LividWo/Revisit-MMT
#: README-baseline.md; shown in the report notes)
PUBLISHED_MULTI30K = {
    "de": "test_2016 39.0 / test_2017 31.3 for an attentive GRU (embeddings 128, GRU 256, one run; Caglayan et al. "
    "2017, lium-lst/wmt17-mmt), test_2016 41.0 for fairseq's transformer_tiny (4+4 layers, d = 128, FFN 256, the "
    "last 10 checkpoints averaged; Wu et al. 2021, LividWo/Revisit-MMT)",
    "fr": "test_2016 59.0 / test_2017 51.9 for an attentive GRU (embeddings 128, GRU 256, one run; Caglayan et al. "
    "2017, lium-lst/wmt17-mmt)",
}
#: the paper's settings for the heads on MT (section 4.2): K = 4, r = 0.5, noise 0.1 on the gate priors; the
#: dropout on tanh(U_k g) is the table's (En-De 0.2, En-Fr 0.15); MoS as the paper's baseline, K = 9. The mini
#: tables' `mixtape` rows run Mesh TensorFlow's form (variants.MIXTAPE_FORMS), the full plans torch's
MT_HEAD_OPTIONS = {
    "mixtape": {"num_gates": 4, "frequent_fraction": 0.5, "gate_noise": 0.1, "scaled_input": True},
    "mos": {"num_components": 9},
}
#: what the full-size plans choose where the paper is silent (in every MT plan's note)
FULL_MIXTAPE_NOTE = (
    "The paper names no optimizer: its 'learning rate 2.5 (2.0), 16K warmup' is tensor2tensor's transformer schedule "
    "(constant * linear_warmup * rsqrt_decay * rsqrt_hidden_size), which t2t's transformer recipes run with Adam "
    "(beta2 0.98); the plan runs it as fairseq's Adam + inverse_sqrt with the same peak. "
    + full_mixtape_form("Adam", "sqrt(d1) (32 / 45)")
    + " d2 = 64 (the gate embedding size) is the library's default: the paper does not give it."
)
#: mini heads: the paper's (softmax, MoS, Mixtape) with both forms of Mixtape's projections; MoS with K = 4, the
#: largest whose cells fit the budget here (the paper's baseline: K = 9)
MINI_HEADS = ["softmax", "mixtape", "mixtape-unscaled", "mos-4"]
MINI_HEAD_OPTIONS = {"plif": {"num_knots": 10000}}


def paper_transformer(arch: str, dim: int, ffn: int, dropout: float, attention_dropout: float) -> List[str]:
    """The Mixtape paper's 6-layer transformer (section 4.2) as fairseq options: 16 heads, shared embeddings, and
    "relative positional encodings [16]" (Shaw et al. 2018): relative keys and values clipped at 20 in every
    self-attention, no absolute positions, as the authors' tensor2tensor ``transformer_relative`` (the paper gives no
    clipping distance)."""
    return [
        "--arch",
        arch,
        "--encoder-layers",
        "6",
        "--decoder-layers",
        "6",
        "--encoder-embed-dim",
        str(dim),
        "--decoder-embed-dim",
        str(dim),
        "--encoder-ffn-embed-dim",
        str(ffn),
        "--decoder-ffn-embed-dim",
        str(ffn),
        "--encoder-attention-heads",
        "16",
        "--decoder-attention-heads",
        "16",
        "--share-all-embeddings",
        "--dropout",
        str(dropout),
        "--attention-dropout",
        str(attention_dropout),
        "--relative-positions",
        "20",
        "--no-token-positional-embeddings",
    ]


def paper_schedule(rate: float, dim: int, warmup: int = 16000) -> List[str]:
    """The paper's rsqrt schedule ``rate * d^-0.5 * min(step/warmup^1.5, step^-0.5)`` as fairseq's inverse_sqrt,
    whose peak learning rate (at ``warmup``) is ``rate / sqrt(d * warmup)``; 4096 tokens a batch per GPU."""
    peak = rate / (dim * warmup) ** 0.5
    return [
        "--optimizer",
        "adam",
        "--adam-betas",
        "(0.9, 0.98)",
        "--lr",
        f"{peak:.3g}",
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        str(warmup),
        "--warmup-init-lr",
        "1e-07",
        "--max-tokens",
        "4096",
        "--label-smoothing",
        "0.1",
        "--clip-norm",
        "0.0",
    ]


@dataclass
class TranslationTable(Table):
    """One translation table: a language pair, the paper's numbers, the full-size model."""

    name: str
    src: str
    tgt: str
    description: str
    paper_bleu: Dict[str, float]
    #: the paper's cost columns per head: seconds (same batch) / ms per instance (same memory)
    paper_costs: Dict[str, Dict[str, float]]
    full_model: List[str]
    full_train: List[str]
    full_updates: int
    gate_dropout: float
    full_data: str
    full_heads: List[str] = field(default_factory=lambda: ["softmax", "mos-9", "mixtape"])
    #: the paper's claimed difference per mini row, as the LM tables give theirs: ``{row: {"relative": head / softmax
    #: - 1 in the paper, "source": where}}`` (the report sets it, at our softmax's BLEU, beside what the seeds detect)
    paper_claims: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    #: seeds of each mini head (at its chosen learning rate; the sweep's seed-1 cell is the first): Mixtape's are
    #: the library's default form's (mixtape-unscaled), Mesh TensorFlow's form (the `mixtape` row) has its sweep's
    mini_seeds: Dict[str, int] = field(default_factory=lambda: {"softmax": 3, "mixtape-unscaled": 3, "mos-4": 3})
    metric = "bleu"
    mini_stop = MINI_STOP
    mini_lr = MINI_LR

    # -- heads -------------------------------------------------------------------------------
    def head_options(self, scale: str) -> Dict[str, Dict[str, Any]]:
        options = {k: dict(v) for k, v in MT_HEAD_OPTIONS.items()}
        options["mixtape"]["gate_dropout"] = self.gate_dropout
        if scale == "mini":
            for head, extra in MINI_HEAD_OPTIONS.items():
                options.setdefault(head, {}).update(extra)
        else:  # the form that trains with the plan's Adam (FULL_MIXTAPE_NOTE)
            options["mixtape"]["scaled_input"] = False
        return options

    def variants(self, args) -> List[Variant]:
        names = args.heads or (MINI_HEADS if args.scale == "mini" else self.full_heads)
        return resolve(names, self.head_options(args.scale))

    # -- commands ----------------------------------------------------------------------------
    def train_command(
        self, bin_dir: str, variant: Variant, seed: int, save_dir: str, args, lr: Optional[float] = None
    ) -> List[str]:
        """Full size: the paper's schedule for ``--max-updates`` (default the paper's) updates. Mini: peak rate
        ``lr`` (default the grid's centre) under the stopping rule (``--max-updates`` adds a cap on updates)."""
        full = args.scale == "full"
        if full:
            model, train = self.full_model, self.full_train
            length = ["--max-update", str(args.max_updates or self.full_updates)]
        else:
            model, train = MINI_MODEL, [*MINI_TRAIN, "--lr", f"{lr or MINI_LR:g}"]
            rule = self.stop_rule(args)
            length = [
                *(rule.fairseq_args() if rule else []),
                *(["--max-update", str(args.max_updates)] if args.max_updates else []),
            ]
        return [
            tool("fairseq-train"),
            bin_dir,
            "--user-dir",
            PLUGIN,
            "--task",
            "translation",
            "--source-lang",
            self.src,
            "--target-lang",
            self.tgt,
            *model,
            "--output-head",
            variant.head,
            "--head-options",
            json.dumps(variant.options, sort_keys=True),
            "--criterion",
            "head_cross_entropy",
            *train,
            *length,
            "--seed",
            str(seed),
            "--save-dir",
            save_dir,
            "--no-epoch-checkpoints",
            "--log-format",
            "json",
            "--log-interval",
            "10",
            "--num-workers",
            "0",
            *(["--cpu"] if not full else ["--fp16"]),
        ]

    def generate_command(self, bin_dir: str, checkpoint: str, subset: str, args) -> List[str]:
        return [
            tool("fairseq-generate"),
            bin_dir,
            "--user-dir",
            PLUGIN,
            "--task",
            "translation",
            "--source-lang",
            self.src,
            "--target-lang",
            self.tgt,
            "--path",
            checkpoint,
            "--gen-subset",
            subset,
            "--beam",
            "5",
            "--lenpen",
            "1.0",
            "--batch-size",
            "128",
            "--max-len-a",
            "1.5",
            "--max-len-b",
            "10",
            # fairseq drops a last batch smaller than the multiple (8): every sentence must be translated
            "--required-batch-size-multiple",
            "1",
            "--post-process",
            "sentencepiece",
            "--num-workers",
            "0",
            *(["--cpu"] if args.scale == "mini" else ["--fp16"]),
        ]

    # -- data --------------------------------------------------------------------------------
    def prepare_mini(self, runner: Runner, args, table_dir: str) -> Dict[str, Any]:
        """Multi30k -> raw references, BPE, ``fairseq-preprocess`` (skipped when done)."""
        prep = os.path.join(table_dir, "data")
        bin_dir = os.path.join(prep, "bin")
        data_prep.multi30k_files(args.data, [self.src, self.tgt])  # a clear stop before anything else
        tests = list(data_prep.MULTI30K_TESTS)
        done = os.path.join(prep, "done.json")
        wanted = {"tests": tests, "bpe_size": args.bpe_size, "limit": args.limit}
        if result_files.load_json(done) != wanted:  # not prepared, or with another BPE size or limit: made again
            limit = ["--limit", str(args.limit)] if args.limit else []
            runner.run(
                [
                    sys.executable,
                    "-m",
                    "recipes.reproduce.data.prepare",
                    "multi30k",
                    "--data",
                    args.data,
                    "--src",
                    self.src,
                    "--tgt",
                    self.tgt,
                    "--bpe-size",
                    str(args.bpe_size),
                    *limit,
                    "--out",
                    prep,
                ],
                os.path.join(prep, "prepare.log"),
                "data",
                comment="data: Multi30k + BPE",
            )
            bpe = os.path.join(prep, "bpe")
            shutil.rmtree(bin_dir, ignore_errors=True)
            runner.run(
                [
                    tool("fairseq-preprocess"),
                    "--source-lang",
                    self.src,
                    "--target-lang",
                    self.tgt,
                    "--trainpref",
                    os.path.join(bpe, "train"),
                    "--validpref",
                    os.path.join(bpe, "valid"),
                    "--testpref",
                    ",".join(os.path.join(bpe, t) for t in tests),
                    "--destdir",
                    bin_dir,
                    "--joined-dictionary",
                    "--workers",
                    "2",
                ],
                os.path.join(prep, "prepare.log"),
                "data",
            )
            result_files.save_json(done, wanted)
        # fairseq names the test sets test, test1, ...
        subsets = {t: ("test" if i == 0 else f"test{i}") for i, t in enumerate(tests)}
        return {"bin": bin_dir, "raw": os.path.join(prep, "raw"), "subsets": subsets}

    # -- one cell ----------------------------------------------------------------------------
    def cell_config(self, variant: Variant, seed: int, args, lr: Optional[float] = None) -> Dict[str, Any]:
        """The settings a finished cell is kept under (a committed cell stands for a new one only if they agree)."""
        full = args.scale == "full"
        config = {
            "table": self.name,
            "head": variant.name,
            "options": variant.options,
            "seed": seed,
            "scale": args.scale,
            "updates": args.max_updates or (self.full_updates if full else None),
            "bpe_size": None if full else args.bpe_size,
            "limit": args.limit,
        }
        if not full:  # cells trained with other mini settings are trained again
            config.update(self.mini_config(args, lr), mini=MINI_MODEL + MINI_TRAIN)
        return config

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
        log_path = os.path.join(cell_dir, "train.log")
        train = self.train_command(
            prepared["bin"], variant, seed, self.checkpoint_dir(table_dir, variant, seed, lr), args, lr
        )
        if not training_done(log_path):
            runner.run(train, log_path, label, comment=f"{label}: train")
        return self.trained_record(table_dir, variant, seed, args, log_path, [shell_line(train)], lr)

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
        """Translate every test set with the best checkpoint (``TESTSET.hyp``, detokenized) and score it."""
        lr = record.get("lr") if args.scale == "mini" else None
        cell_dir = result_files.cell_dir(table_dir, variant.name, seed, lr)
        checkpoint = os.path.join(self.checkpoint_dir(table_dir, variant, seed, lr), "checkpoint_best.pt")
        bleu, commands = {}, []
        for testset, subset in prepared["subsets"].items():
            gen = self.generate_command(prepared["bin"], checkpoint, subset, args)
            out = runner.run(
                gen,
                os.path.join(cell_dir, f"generate-{testset}.log"),
                label,
                comment=f"{label}: translate {testset} (hypotheses: H-lines, detokenized)",
            )
            hyps = hypotheses(out)
            refs = data_prep.read_lines(os.path.join(prepared["raw"], f"{testset}.{self.tgt}"))
            if len(hyps) != len(refs):
                raise SystemExit(
                    f"cell {label}: {len(hyps)} hypotheses for {len(refs)} references of {testset}; "
                    f"see {os.path.join(cell_dir, f'generate-{testset}.log')}"
                )
            hyp_path = os.path.join(cell_dir, f"{testset}.hyp")
            data_prep.write_lines(hyp_path, hyps)
            ref_path = os.path.join(prepared["raw"], f"{testset}.{self.tgt}")
            score_cmd = ["sacrebleu", ref_path, "-i", hyp_path, "-m", "bleu", "-b", "-w", "2"]
            runner.record(score_cmd, comment=f"{label}: score {testset}")
            bleu[testset] = corpus_bleu(hyps, refs)
            commands += [shell_line(gen), shell_line(score_cmd)]
        return bleu, commands

    def prepare(self, runner: Runner, args, table_dir: str) -> Dict[str, Any]:
        if args.scale == "full":
            return wmt.prepared_full(self, args)
        return self.prepare_mini(runner, args, table_dir)

    def plan(self, variants, args, table_dir: str, log=print) -> Dict[str, Any]:
        return full_plan(self, variants, args, table_dir, log)

    def dataset(self, args) -> str:
        return "multi30k" if args.scale == "mini" else "wmt14"

    @property
    def report_notes(self) -> str:
        return (
            f"Mini: Multi30k {self.src}->{self.tgt} (train 29k pairs; test_2016_flickr and test_2017_flickr, "
            f"1,000 sentences each), a {MINI_BPE // 1000}k joint sentencepiece BPE, a 3+3-layer 128-d pre-norm "
            f"transformer (FFN 256, 4 attention heads), batches of 1024 tokens, {MINI_STOP.describe()}, beam 5, "
            f"sacrebleu (13a) on the detokenized hypotheses. "
            f"The paper's numbers are WMT'14 newstest2014 with 0.2B / 0.8B-parameter models: compare the "
            f"ordering of the heads, not the values. What a converged small model reaches on Multi30k, published "
            f"text-only systems trained on the same pairs: {PUBLISHED_MULTI30K[self.tgt]}; their BLEU is on "
            f"lowercased, tokenized text (the lowercased BLEU of every head is below the table). MoS runs with "
            f"K = 4 here (the paper's baseline: K = 9)."
        )

    def paper_for(self, variant: Variant, split: str) -> Optional[float]:
        return self.paper_bleu.get(variant.name)


def hypotheses(generate_output: str) -> List[str]:
    """The detokenized hypotheses (``H-i`` lines) of fairseq-generate's output, in source order."""
    hyps = {}
    for line in generate_output.splitlines():
        if line.startswith("H-"):
            idx, _score, *text = line.split("\t")
            hyps[int(idx[2:])] = text[0] if text else ""
    return [hyps[i] for i in sorted(hyps)]


def corpus_bleu(hyps: Sequence[str], refs: Sequence[str], lowercase: bool = False) -> float:
    """sacrebleu's corpus BLEU (13a tokenisation, as the ``sacrebleu`` command line), detokenized input; with
    ``lowercase``, case-insensitive (``sacrebleu -lc``), as the published Multi30k numbers are scored."""
    import sacrebleu

    return round(sacrebleu.corpus_bleu(list(hyps), [list(refs)], lowercase=lowercase).score, 2)


def _dummy_bin(table, size: int, directory: str) -> str:
    """Dictionaries of ``size`` symbols (the joint BPE's size): enough for fairseq to build the models."""
    for lang in (table.src, table.tgt):
        with open(os.path.join(directory, f"dict.{lang}.txt"), "w") as f:
            f.write("".join(f"tok{i} {size - i}\n" for i in range(size - 4)))  # + 4 specials = size
    return directory


def full_plan(table, variants, args, table_dir: str, log=print) -> Dict[str, Any]:
    """The full-size commands of every cell, and each head's parameter count; written to ``plan.json``."""
    pair = f"{table.src}-{table.tgt}"
    spec = wmt.CORPORA[pair]
    bin_dir = os.path.join(wmt.data_dir(args, table), "bin")
    commands = [shell_line([sys.executable, "-m", "recipes.reproduce.data.wmt", "--pair", pair, "--data", args.data])]
    parameters = {}
    with tempfile.TemporaryDirectory() as tmp:
        fake = _dummy_bin(table, spec["bpe"], tmp)
        for v in variants:
            seeds = table.seeds_for(v, args)
            for seed in seeds:
                cell = result_files.cell_dir(table_dir, v.name, seed)
                train = table.train_command(bin_dir, v, seed, os.path.join(cell, "checkpoints"), args)
                gen = table.generate_command(
                    bin_dir, os.path.join(cell, "checkpoints", "checkpoint_best.pt"), "test", args
                )
                commands += [
                    shell_line(train),
                    shell_line(gen) + f" > {cell}/generate-{wmt.TESTSET}.log",
                    f"# {wmt.TESTSET}.hyp = the H- lines in id order; then: sacrebleu -t wmt14/full -l {pair} "
                    f"-i {cell}/{wmt.TESTSET}.hyp -m bleu -b",
                ]
            train = table.train_command(fake, v, 1, os.path.join(tmp, "ck"), args)
            parameters[v.name] = count_parameters(train[1:])
            log(f"{table.name} {v.name}: {parameters[v.name] / 1e6:.1f}M parameters")
    result = {
        "commands": commands,
        "parameters": parameters,
        "vocabulary": spec["bpe"],
        "note": "Relative position representations (Shaw et al. 2018, the paper's reference [16]) in every "
        "self-attention, clipped at 20 and without absolute positions, as the authors' tensor2tensor "
        "transformer_relative (--relative-positions 20 --no-token-positional-embeddings; the paper "
        "gives no k); its GPU count comes from fairseq (all visible GPUs); the paper's batch of 4096 "
        "tokens is per GPU (--max-tokens 4096). " + FULL_MIXTAPE_NOTE,
    }
    result_files.save_json(os.path.join(table_dir, "plan.json"), result)
    return result
