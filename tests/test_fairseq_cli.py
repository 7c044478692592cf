"""The fairseq plugin through the real command line, on tiny generated data (like fairseq's
tests/test_binaries.py): preprocess -> train -> eval-lm / generate / interactive, every head."""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import socket
import subprocess
import sys

import pytest

fairseq = pytest.importorskip("fairseq", reason="fairseq not installed: run `make install` (pip install -e .[fairseq])")

import fairseq_plugin  # noqa: E402,F401  (head checkpoints load after it: torch.load below, like users)
import hf_heads  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = os.path.join(ROOT, "fairseq_plugin")
SHARED_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data")
BIN = os.path.dirname(sys.executable)

HEAD_OPTIONS = {
    "softmax": {},
    "sigsoftmax": {},
    "mos": {"num_components": 2},
    "mixtape": {"num_gates": 4, "frequent_fraction": 0.5, "gate_embedding_size": 8},
    "plif": {"num_knots": 1000},
    "mos_plif": {"num_components": 2, "num_knots": 1000},
    "ds_softmax": {"num_experts": 2},
    "class_softmax": {"num_classes": 8},
    "d_softmax": {"band_fractions": [0.25, 0.75], "band_dims": [24, 8]},
}
#: every head trains and decodes through fairseq's commands; by default those whose plugin paths differ (a single
#: softmax, a mixture tied and untied, an auxiliary loss with pruning state, frequency classes), the others in the
#: slow tier (`make test-slow`): the same paths as these, each head's math tested in-process by test_heads.py
CLI_DEFAULT_HEADS = ("softmax", "mixtape", "mos", "ds_softmax", "class_softmax")
CLI_HEADS = [h if h in CLI_DEFAULT_HEADS else pytest.param(h, marks=pytest.mark.slow) for h in HEAD_OPTIONS]
SMALL_LM = [
    "--decoder-layers",
    "1",
    "--decoder-embed-dim",
    "32",
    "--decoder-ffn-embed-dim",
    "64",
    "--decoder-attention-heads",
    "2",
    "--tokens-per-sample",
    "32",
]
SMALL_MT = [
    "--encoder-layers",
    "1",
    "--decoder-layers",
    "1",
    "--encoder-embed-dim",
    "32",
    "--decoder-embed-dim",
    "32",
    "--encoder-ffn-embed-dim",
    "64",
    "--decoder-ffn-embed-dim",
    "64",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
]
GENERATE = ["--cpu", "--max-tokens", "1024", "--num-workers", "0", "--max-len-a", "1", "--max-len-b", "5"]
TRAIN = [
    "--optimizer",
    "adam",
    "--lr",
    "0.003",
    "--max-tokens",
    "1024",
    "--cpu",
    "--no-epoch-checkpoints",
    "--log-format",
    "simple",
    "--log-interval",
    "1",
    "--num-workers",
    "0",
]


def clean_env():
    """The environment for fairseq runs, without any variable that switches torch's weights-only
    loading off: checkpoints must load under torch's defaults."""
    env = {k: v for k, v in os.environ.items() if "WEIGHTS_ONLY" not in k}
    env["PYTHONWARNINGS"] = "ignore"
    return env


def cli(tool, *args, check=True, stdin=None, timeout=600):
    """Run a fairseq console script; return its combined output."""
    cmd = [os.path.join(BIN, tool) if os.path.exists(os.path.join(BIN, tool)) else tool, *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, input=stdin, timeout=timeout, env=clean_env())
    out = proc.stdout + proc.stderr
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-4000:]}")
    return out if check else (proc.returncode, out)


def _sentence(rng, words):
    return " ".join(rng.choice(words[: rng.randint(5, len(words))]) for _ in range(rng.randint(3, 9)))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Tiny LM corpus and a word-reversal 'translation' task, binarised by fairseq-preprocess."""
    d = tmp_path_factory.mktemp("fairseq_data")
    rng = random.Random(0)
    words = [f"w{i}" for i in range(60)]
    for split, n in (("train", 300), ("valid", 60), ("test", 60)):  # >= 8 LM blocks each
        lines = [_sentence(rng, words) for _ in range(n)]
        (d / f"lm.{split}").write_text("\n".join(lines) + "\n")
        (d / f"{split}.src").write_text("\n".join(lines) + "\n")
        (d / f"{split}.tgt").write_text("\n".join(" ".join(reversed(s.split())) for s in lines) + "\n")
    cli(
        "fairseq-preprocess",
        "--only-source",
        "--trainpref",
        d / "lm.train",
        "--validpref",
        d / "lm.valid",
        "--testpref",
        d / "lm.test",
        "--destdir",
        d / "lm-bin",
        "--workers",
        "1",
    )
    cli(
        "fairseq-preprocess",
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        "--trainpref",
        d / "train",
        "--validpref",
        d / "valid",
        "--testpref",
        d / "test",
        "--destdir",
        d / "mt-bin",
        "--joined-dictionary",
        "--workers",
        "1",
    )
    return d


def train_lm(data, save_dir, head, *extra, updates=3):
    return cli(
        "fairseq-train",
        data / "lm-bin",
        "--user-dir",
        PLUGIN,
        "--task",
        "language_modeling",
        "--arch",
        "head_transformer_lm_gpt2_tiny",
        *SMALL_LM,
        "--output-head",
        head,
        "--head-options",
        json.dumps(HEAD_OPTIONS[head]),
        "--criterion",
        "head_cross_entropy",
        *TRAIN,
        "--max-update",
        updates,
        "--save-dir",
        save_dir,
        *extra,
    )


def train_mt(data, save_dir, head, *extra, updates=3, check=True):
    return cli(
        "fairseq-train",
        data / "mt-bin",
        "--user-dir",
        PLUGIN,
        "--task",
        "translation",
        "--arch",
        "head_transformer_iwslt_de_en",
        *SMALL_MT,
        "--output-head",
        head,
        "--head-options",
        json.dumps(HEAD_OPTIONS[head]),
        "--criterion",
        "head_cross_entropy",
        *TRAIN,
        "--max-update",
        updates,
        "--save-dir",
        save_dir,
        *extra,
        check=check,
    )


def _last_train_stats(out):
    lines = [line for line in out.splitlines() if "| train |" in line]
    assert lines, out[-3000:]
    return lines[-1]


@pytest.mark.parametrize("head", CLI_HEADS)
def test_lm_train_then_eval_lm(data, tmp_path, head):
    tie = ["--share-decoder-input-output-embed"] if head in ("softmax", "mixtape", "mos") else []
    out = train_lm(data, tmp_path, head, *tie)
    stats = _last_train_stats(out)
    assert re.search(r"nll_loss [\d.]+ \| (.* \| )?ppl [\d.]+", stats), stats
    assert (tmp_path / "checkpoint_last.pt").exists()
    out = cli(
        "fairseq-eval-lm",
        data / "lm-bin",
        "--user-dir",
        PLUGIN,
        "--path",
        tmp_path / "checkpoint_last.pt",
        "--cpu",
        "--tokens-per-sample",
        "32",
        "--max-tokens",
        "1024",
        "--num-workers",
        "0",
    )
    ppl = float(re.search(r"Perplexity: ([\d.]+)", out).group(1))
    assert 1.0 < ppl < 200.0  # vocabulary of ~64: a finite, sensible perplexity


@pytest.mark.parametrize("head", CLI_HEADS)
def test_mt_train_then_generate_with_beam_and_sampling(data, tmp_path, head):
    share = ["--share-all-embeddings"] if hf_heads.get_head_class(head).can_tie else []  # DS-Softmax cannot
    out = train_mt(data, tmp_path, head, *share, "--label-smoothing", "0.1")
    assert "nll_loss" in _last_train_stats(out)
    ckpt = tmp_path / "checkpoint_last.pt"
    out = cli(
        "fairseq-generate",
        data / "mt-bin",
        "--user-dir",
        PLUGIN,
        "--path",
        ckpt,
        *GENERATE,
        "--beam",
        "2",
        "--scoring",
        "sacrebleu",
    )
    assert re.search(r"^H-\d+\t-?[\d.]+\t", out, re.M) and "BLEU" in out
    out = cli(
        "fairseq-generate",
        data / "mt-bin",
        "--user-dir",
        PLUGIN,
        "--path",
        ckpt,
        *GENERATE,
        "--beam",
        "1",
        "--sampling",
        "--sampling-topk",
        "5",
    )
    assert re.search(r"^H-\d+\t-?[\d.]+\t", out, re.M)


@pytest.mark.slow  # 78 s: the relative-attention module is tests/test_relative_attention.py's in the default run
def test_relative_positions_train_generate_and_eval_lm(data, tmp_path):
    """--relative-positions K (Shaw et al. 2018, the Mixtape paper's transformer): every self-attention of the
    encoder and decoder gets K-clipped relative keys and values, encoder-decoder attention does not; training,
    beam search (incremental decoding, reordered caches) and eval-lm run; a bad K is a usage error."""
    import torch

    out = train_mt(
        data,
        tmp_path / "mt",
        "mixtape",
        "--relative-positions",
        "4",
        "--no-token-positional-embeddings",
        "--share-all-embeddings",
    )
    assert "nll_loss" in _last_train_stats(out)
    ckpt = tmp_path / "mt" / "checkpoint_last.pt"
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["model"]
    relative = sorted(k for k in state if k.endswith("relative_keys"))
    assert relative == ["decoder.layers.0.self_attn.relative_keys", "encoder.layers.0.self_attn.relative_keys"]
    assert state[relative[0]].shape == (9, 16)  # 2K + 1 distances x head size (32 / 2 heads)
    assert not any("embed_positions" in k for k in state)
    out = cli("fairseq-generate", data / "mt-bin", "--user-dir", PLUGIN, "--path", ckpt, *GENERATE, "--beam", "2")
    assert re.search(r"^H-\d+\t-?[\d.]+\t", out, re.M)
    train_lm(data, tmp_path / "lm", "softmax", "--relative-positions", "3")
    out = cli(
        "fairseq-eval-lm",
        data / "lm-bin",
        "--user-dir",
        PLUGIN,
        "--path",
        tmp_path / "lm" / "checkpoint_last.pt",
        "--cpu",
        "--tokens-per-sample",
        "32",
        "--max-tokens",
        "1024",
        "--num-workers",
        "0",
    )
    assert 1.0 < float(re.search(r"Perplexity: ([\d.]+)", out).group(1)) < 200.0
    code, out = train_mt(data, tmp_path / "bad", "softmax", "--relative-positions", "-1", check=False)
    assert code != 0 and "--relative-positions must be >= 0" in out


@pytest.mark.slow  # 92 s: --model-overrides stays in the default run (tests/test_fairseq_stock.py, at generation)
def test_softmax_checkpoint_evaluated_with_fast_heads_via_model_overrides(data, tmp_path):
    """A model trained with --output-head softmax is scored with svd_softmax / adaptive_sampling by overriding
    the head at evaluation time (same parameters): exact settings give the softmax's perplexity."""
    train_lm(data, tmp_path, "softmax", "--share-decoder-input-output-embed", updates=5)

    def eval_lm(*override):
        out = cli(
            "fairseq-eval-lm",
            data / "lm-bin",
            "--user-dir",
            PLUGIN,
            "--path",
            tmp_path / "checkpoint_last.pt",
            "--cpu",
            "--tokens-per-sample",
            "32",
            "--max-tokens",
            "1024",
            "--num-workers",
            "0",
            *override,
        )
        return float(re.search(r"Perplexity: ([\d.]+)", out).group(1))

    def override(head, options):
        return ["--model-overrides", repr({"output_head": head, "head_options": json.dumps(options)})]

    base = eval_lm()
    assert eval_lm(*override("svd_softmax", {"preview_rank": 32})) == pytest.approx(base, rel=1e-4)  # full rank
    approx = eval_lm(*override("svd_softmax", {"preview_rank": 4, "num_refine": 8}))
    assert 1.0 < approx < 1e4 and approx != pytest.approx(base, rel=1e-6)  # the preview is really used
    assert eval_lm(*override("adaptive_sampling", {})) == pytest.approx(base, rel=1e-4)  # its log-probs are exact


def test_interactive_translation(data, tmp_path):
    train_mt(data, tmp_path, "mixtape", "--share-all-embeddings")
    out = cli(
        "fairseq-interactive",
        data / "mt-bin",
        "--user-dir",
        PLUGIN,
        "--path",
        tmp_path / "checkpoint_last.pt",
        "--cpu",
        "--beam",
        "2",
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        stdin="w1 w2 w3\nw4 w5\n",
    )
    assert len(re.findall(r"^H-\d+\t", out, re.M)) == 2, out[-2000:]


def test_restore_file_resumes_with_the_head_state(data, tmp_path):
    import torch

    train_lm(data, tmp_path, "plif", updates=2)
    state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu")  # weights_only default
    head_keys = [k for k in state["model"] if k.startswith("decoder.head.")]
    assert "decoder.head.plif.slope_params" in head_keys and "decoder.head.weight" in head_keys
    assert not any(k.startswith("decoder.output_projection") for k in state["model"])
    out = train_lm(data, tmp_path, "plif", "--restore-file", tmp_path / "checkpoint_last.pt", updates=4)
    assert re.search(r"Loaded checkpoint .*\(epoch \d+ @ 2 updates\)", out), out[-3000:]
    assert "num_updates 4" in _last_train_stats(out)
    resumed = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu")
    assert not torch.equal(
        resumed["model"]["decoder.head.plif.slope_params"], state["model"]["decoder.head.plif.slope_params"]
    )  # it kept training the head


@pytest.mark.long
def test_ds_softmax_pruning_state_survives_checkpoint_resume(data, tmp_path):
    import torch

    opts = json.dumps({"num_experts": 2, "prune_start": 2, "prune_interval": 100, "prune_cutoff": 1e9})
    train_lm(data, tmp_path, "ds_softmax", "--head-options", opts, updates=2)  # prunes at its 2nd step
    state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu")["model"]
    mask = state["decoder.head.mask"]
    assert int(state["decoder.head.num_steps"]) == 2
    assert (mask.sum(0) == 1).all()  # every class kept by exactly one expert (everything under the cutoff)
    out = train_lm(
        data,
        tmp_path,
        "ds_softmax",
        "--head-options",
        opts,
        "--restore-file",
        tmp_path / "checkpoint_last.pt",
        updates=4,
    )
    assert "num_updates 4" in _last_train_stats(out)
    resumed = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu")["model"]
    assert int(resumed["decoder.head.num_steps"]) == 4 and torch.equal(resumed["decoder.head.mask"], mask)
    out = cli(
        "fairseq-eval-lm",
        data / "lm-bin",
        "--user-dir",
        PLUGIN,
        "--path",
        tmp_path / "checkpoint_last.pt",
        "--cpu",
        "--tokens-per-sample",
        "32",
        "--max-tokens",
        "1024",
        "--num-workers",
        "0",
    )
    assert "Perplexity:" in out  # inf where a target sits outside the chosen expert: the head's real score


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--output-head", "mixtap"],
            "--output-head 'mixtap' is not a head (did you mean 'mixtape'?); choose one of: ",
        ),
        (
            ["--output-head", "mixtape", "--head-options", '{"num_gates": 3}'],
            "--output-head mixtape --head-options: mixtape: option num_gates=3 is out of range; "
            "allowed: a power of two",
        ),
        (
            ["--output-head", "mos", "--head-options", "{num_components: 2}"],
            "--head-options '{num_components: 2}' is not valid JSON",
        ),
        (
            ["--output-head", "mos", "--head-options", '{"num_component": 2}'],
            "mos: unknown option(s) num_component (did you mean num_components?); allowed options: context_activation, "
            "dropout, identity_init, logit_scale, logit_softcap, num_components, use_bias\n",
        ),  # hidden_size etc. come from the model: not listed
        (["--output-head", "mixtape", "--head-options", '{"num_gates": "4"}'], "num_gates='4' must be an integer"),
        (["--output-head", "mos", "--head-options", '{"vocab_size": 2}'], "must not set 'vocab_size'"),
        (["--output-head", "mos", "--head-options", "[1, 2]"], "must be a JSON object"),
        (
            ["--output-head", "ds_softmax", "--share-all-embeddings"],
            "--output-head ds_softmax: ds_softmax: the output embedding cannot be tied to the input embedding",
        ),
        (
            ["--output-head", "mos", "--head-start", "pretrain"],
            "--output-head mos: --head-start='pretrain' is not a start (did you mean 'pretrained'?)",
        ),
        (
            ["--output-head", "sigsoftmax", "--head-start", "pretrained"],
            "--output-head sigsoftmax: --head-start='pretrained': the sigsoftmax head has no start that equals",
        ),
    ],
)
def test_bad_head_flags_stop_before_training(data, tmp_path, args, message):
    code, out = cli(
        "fairseq-train",
        data / "mt-bin",
        "--user-dir",
        PLUGIN,
        "--task",
        "translation",
        "--arch",
        "head_transformer_iwslt_de_en",
        *SMALL_MT,
        *args,
        "--criterion",
        "head_cross_entropy",
        *TRAIN,
        "--max-update",
        1,
        "--save-dir",
        tmp_path,
        check=False,
    )
    assert code == 2 and message in out, out[-2000:]  # a usage error, as argparse gives
    assert "Traceback" not in out and "Start iterating over samples" not in out


@pytest.mark.parametrize("criterion", ["cross_entropy", "label_smoothed_cross_entropy"])
def test_stock_criteria_refuse_a_head_with_an_aux_loss_and_warn_for_others(data, tmp_path, criterion):
    common = [
        "fairseq-train",
        data / "mt-bin",
        "--user-dir",
        PLUGIN,
        "--task",
        "translation",
        "--arch",
        "head_transformer_iwslt_de_en",
        *SMALL_MT,
        "--criterion",
        criterion,
        *TRAIN,
        "--max-update",
        1,
    ]
    code, out = cli(
        *common,
        "--output-head",
        "ds_softmax",
        "--head-options",
        json.dumps(HEAD_OPTIONS["ds_softmax"]),
        "--save-dir",
        tmp_path / "ds",
        check=False,
    )
    assert code == 2 and "Traceback" not in out, out[-2000:]
    assert "has an auxiliary loss that this --criterion drops; use --criterion head_cross_entropy" in out
    out = cli(
        *common,
        "--output-head",
        "mos",
        "--head-options",
        json.dumps(HEAD_OPTIONS["mos"]),
        "--save-dir",
        tmp_path / "mos",
    )
    assert out.count("--criterion head_cross_entropy trains with the head's memory-lean loss") == 1


def test_head_criterion_refuses_a_model_without_head(data, tmp_path):
    code, out = cli(
        "fairseq-train",
        data / "lm-bin",
        "--user-dir",
        PLUGIN,
        "--task",
        "language_modeling",
        "--arch",
        "transformer_lm_gpt2_tiny",
        *SMALL_LM,
        "--criterion",
        "head_cross_entropy",
        *TRAIN,
        "--max-update",
        1,
        "--save-dir",
        tmp_path,
        check=False,
    )
    assert code != 0 and "needs a model with an output head: use --arch head_ARCH" in out


def test_user_dir_from_the_installed_copy(data, tmp_path):
    installed = os.path.dirname(os.path.abspath(fairseq_plugin.__file__))
    out = cli(
        "fairseq-train",
        data / "lm-bin",
        "--user-dir",
        installed,
        "--task",
        "language_modeling",
        "--arch",
        "head_transformer_lm_gpt2_tiny",
        *SMALL_LM,
        "--output-head",
        "sigsoftmax",
        "--criterion",
        "head_cross_entropy",
        *TRAIN,
        "--max-update",
        1,
        "--save-dir",
        tmp_path,
    )
    assert "num_updates 1" in _last_train_stats(out)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_distributed_training_two_cpu_processes(data, tmp_path):
    """fairseq's c10d DDP passes device_ids and fails on CPU; legacy_ddp + gloo works (README)."""
    port = _free_port()
    common = [
        "fairseq-train",
        data / "lm-bin",
        "--user-dir",
        PLUGIN,
        "--task",
        "language_modeling",
        "--arch",
        "head_transformer_lm_gpt2_tiny",
        *SMALL_LM,
        "--output-head",
        "mixtape",
        "--head-options",
        json.dumps(HEAD_OPTIONS["mixtape"]),
        "--criterion",
        "head_cross_entropy",
        *TRAIN,
        "--max-update",
        2,
        "--save-dir",
        tmp_path,
        "--distributed-world-size",
        2,
        "--distributed-backend",
        "gloo",
        "--distributed-init-method",
        f"tcp://127.0.0.1:{port}",
        "--distributed-no-spawn",
        "--ddp-backend",
        "legacy_ddp",
    ]
    env = clean_env()
    procs = [
        subprocess.Popen(
            [os.path.join(BIN, common[0]), *map(str, common[1:]), "--distributed-rank", str(r)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    assert "distributed init (rank 0)" in outs[0] and "num_updates 2" in _last_train_stats(outs[0])


def test_architectures_mirror_every_stock_transformer_arch():
    from fairseq import options
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    stock = [a for a, m in ARCH_MODEL_NAME_REGISTRY.items() if m in ("transformer", "transformer_lm")]
    assert len(stock) > 20
    for arch in stock:
        assert ARCH_MODEL_NAME_REGISTRY[f"head_{arch}"] == f"head_{ARCH_MODEL_NAME_REGISTRY[arch]}"
    for arch, task in (
        ("transformer_vaswani_wmt_en_de_big", "translation"),
        ("transformer_wmt_en_de", "translation"),
        ("transformer_lm_gpt2_small", "language_modeling"),
    ):
        parsed = {}
        for a in (arch, f"head_{arch}"):
            parser = options.get_training_parser()
            parsed[a] = vars(options.parse_args_and_arch(parser, ["data", "--task", task, "--arch", a]))
        stock_args, head_args = parsed[arch], parsed[f"head_{arch}"]
        for key, value in stock_args.items():
            if key not in ("arch", "_name"):
                assert head_args[key] == value, (arch, key)
        assert head_args["output_head"] == "softmax" and head_args["head_options"] == "{}"


def test_fp16_model_keeps_head_math_fp32(data, tmp_path):
    """What --fp16 does to the model (a .half() copy) on a device without CUDA: log-probs stay
    float32 and finite, equal to the fp32 model's up to fp16 rounding of the hidden states."""
    import torch
    from fairseq import checkpoint_utils

    train_lm(data, tmp_path, "mos_plif", updates=2)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(tmp_path / "checkpoint_last.pt")])
    model = models[0].eval()
    tokens = torch.randint(4, 40, (2, 12))
    with torch.no_grad():
        out32 = model(tokens)
        lp32 = model.get_normalized_probs(out32, log_probs=True)
        model.half()
        out16 = model(tokens)
        lp16 = model.get_normalized_probs(out16, log_probs=True)
    assert out16[0].dtype == torch.float16 and lp16.dtype == torch.float32
    assert torch.isfinite(lp16).all()
    torch.testing.assert_close(lp16.exp().sum(-1), torch.ones(2, 12), atol=1e-4, rtol=0)
    assert (lp16 - lp32).abs().max() < 0.1


def test_old_checkpoints_load_with_weights_only(data, tmp_path):
    """torch >= 2.6 loads with weights_only=True: a checkpoint whose config is an omegaconf
    DictConfig (fairseq 0.10-0.11) or holds an argparse.Namespace must still load, with no
    environment variable (clean_env drops any), through fairseq's own loader."""
    import argparse

    import torch
    from omegaconf import OmegaConf

    train_lm(data, tmp_path, "softmax", updates=1)
    state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu")
    state["cfg"] = OmegaConf.create(state["cfg"])
    torch.save(state, tmp_path / "dictconfig.pt")
    out = cli(
        "fairseq-eval-lm",
        data / "lm-bin",
        "--user-dir",
        PLUGIN,
        "--path",
        tmp_path / "dictconfig.pt",
        "--cpu",
        "--tokens-per-sample",
        "32",
        "--max-tokens",
        "1024",
        "--num-workers",
        "0",
    )
    assert "Perplexity" in out
    state["extra_namespace"] = argparse.Namespace(arch="head_transformer_lm", lr=[0.1])
    torch.save(state, tmp_path / "namespace.pt")
    code = (
        "import torch, fairseq_plugin; s = torch.load(%r, map_location='cpu'); "
        "print(type(s['extra_namespace']).__name__)"
    ) % str(tmp_path / "namespace.pt")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=clean_env())
    assert proc.returncode == 0 and "Namespace" in proc.stdout, proc.stderr[-2000:]
    # and the allow-list is what makes it work: torch alone refuses the file
    proc = subprocess.run(
        [sys.executable, "-c", "import torch; torch.load(%r)" % str(tmp_path / "namespace.pt")],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert proc.returncode != 0 and "Weights only load failed" in proc.stderr


HUB = """
import sys
if "import" in sys.argv:
    import fairseq_plugin
from fairseq.models.transformer import TransformerModel
hub = TransformerModel.from_pretrained(sys.argv[1], "checkpoint_last.pt", sys.argv[2])
print(type(hub.models[0].decoder.head).__name__, "|", hub.translate("w1 w2 w3", beam=2))
"""


@pytest.mark.long
def test_hub_checkpoint_without_user_dir_names_the_plugin_or_loads(data, tmp_path):
    """A head checkpoint starts with a marker of the plugin's: without the plugin torch's weights-only error names
    user_dir and fairseq_plugin; after `import fairseq_plugin` it loads; with weights_only off (torch's variable)
    unpickling imports the plugin, so no user_dir is needed."""
    import torch
    from fairseq_plugin.checkpoint import MARKER_KEY, MARKER_NAME

    train_mt(data, tmp_path, "mixtape", updates=1)
    assert next(iter(torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu"))) == MARKER_KEY

    def hub(*args, **env):
        return subprocess.run(
            [sys.executable, "-c", HUB, str(tmp_path), str(data / "mt-bin"), *args],
            capture_output=True,
            text=True,
            cwd=str(tmp_path),
            env={**clean_env(), **env},
        )

    bare = hub()
    assert bare.returncode != 0 and f"fairseq_plugin.checkpoint.{MARKER_NAME}" in bare.stderr, bare.stderr[-2000:]
    assert "user_dir" in MARKER_NAME and "import_fairseq_plugin" in MARKER_NAME
    for proc in (hub("import"), hub(TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")):
        assert proc.returncode == 0 and "MixtapeHead |" in proc.stdout, proc.stderr[-2000:]


def _multi30k_slice(dst, n_train=2000, n_valid=100, n_test=100):
    src_dir = os.path.join(SHARED_DATA, "multi30k")
    for split, name, n in (
        ("train", "train", n_train),
        ("valid", "val", n_valid),
        ("test", "test_2016_flickr", n_test),
    ):
        for lang in ("en", "de"):
            with gzip.open(os.path.join(src_dir, f"{name}.{lang}.gz"), "rt", encoding="utf-8") as f:
                lines = [next(f).strip().lower() for _ in range(n)]
            # a crude tokeniser is enough here: split punctuation off words
            lines = [re.sub(r"([.,!?;:\"()])", r" \1 ", line) for line in lines]
            (dst / f"{split}.{lang}").write_text("\n".join(" ".join(line.split()) for line in lines) + "\n")


@pytest.mark.skipif(
    not os.path.isdir(os.path.join(SHARED_DATA, "multi30k")),
    reason=f"Multi30k not found at {SHARED_DATA}/multi30k (the shared offline data)",
)
@pytest.mark.long
def test_multi30k_slice_en_de_with_mixtape(tmp_path):
    _multi30k_slice(tmp_path)
    cli(
        "fairseq-preprocess",
        "--source-lang",
        "en",
        "--target-lang",
        "de",
        "--trainpref",
        tmp_path / "train",
        "--validpref",
        tmp_path / "valid",
        "--testpref",
        tmp_path / "test",
        "--destdir",
        tmp_path / "bin",
        "--joined-dictionary",
        "--thresholdtgt",
        "2",
        "--thresholdsrc",
        "2",
        "--workers",
        "1",
    )
    out = cli(
        "fairseq-train",
        tmp_path / "bin",
        "--user-dir",
        PLUGIN,
        "--task",
        "translation",
        "--arch",
        "head_transformer_iwslt_de_en",
        *SMALL_MT,
        "--share-all-embeddings",
        "--output-head",
        "mixtape",
        "--head-options",
        '{"frequent_fraction": 0.5, "gate_embedding_size": 16}',
        "--criterion",
        "head_cross_entropy",
        "--label-smoothing",
        "0.1",
        *TRAIN,
        "--max-tokens",
        "2048",
        "--max-update",
        20,
        "--save-dir",
        tmp_path / "ckpt",
    )
    first = float(re.search(r"train_inner \| epoch 001:\s+1 / \d+ loss=([\d.]+)", out).group(1))
    last = float(re.search(r"\| train \| .* loss ([\d.]+) \|", _last_train_stats(out)).group(1))
    assert last < first
    out = cli(
        "fairseq-generate",
        tmp_path / "bin",
        "--user-dir",
        PLUGIN,
        "--path",
        tmp_path / "ckpt" / "checkpoint_last.pt",
        *GENERATE,
        "--beam",
        "2",
        "--scoring",
        "sacrebleu",
    )
    assert re.search(r"BLEU = [\d.]+", out)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_head_criterion_equals_fairseqs_own_criteria(data, tmp_path, eps):
    """On the same model and batch, head_cross_entropy gives what fairseq's cross_entropy /
    label_smoothed_cross_entropy give through get_normalized_probs (loss and nll_loss)."""
    import torch
    from fairseq import checkpoint_utils
    from fairseq.criterions.cross_entropy import CrossEntropyCriterion
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    from fairseq_plugin.criterions import HeadCrossEntropyCriterion

    train_lm(data, tmp_path, "mixtape", updates=1)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(tmp_path / "checkpoint_last.pt")])
    model = models[0].eval()
    pad = task.target_dictionary.pad()
    tokens = torch.randint(4, len(task.target_dictionary), (3, 10))
    target = torch.randint(4, len(task.target_dictionary), (3, 10))
    target[0, 7:] = pad
    sample = {
        "net_input": {"src_tokens": tokens, "src_lengths": torch.full((3,), 10)},
        "target": target,
        "ntokens": int(target.ne(pad).sum()),
    }
    ours = HeadCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=eps)
    stock = (
        LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=eps)
        if eps
        else CrossEntropyCriterion(task, sentence_avg=False)
    )
    with torch.no_grad():
        loss, size, log = ours(model, sample)
        ref_loss, ref_size, ref_log = stock(model, sample)
    assert size == ref_size == sample["ntokens"]
    torch.testing.assert_close(loss, ref_loss.to(loss.dtype), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(
        log["nll_loss"], ref_log.get("nll_loss", ref_log["loss"]).to(loss.dtype), rtol=1e-5, atol=1e-4
    )


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_head_criterion_trains_with_the_lean_loss_and_matches_the_reference(data, tmp_path, eps, monkeypatch):
    """Training mode: the criterion's loss and every gradient are the same with the memory-lean loss (the
    default), with its Triton kernels (head.lean_kernel = "triton"; in the interpreter here) and with the reference
    path (head.lean_loss = False); randomness off."""
    import torch
    from fairseq import checkpoint_utils

    from fairseq_plugin.criterions import HeadCrossEntropyCriterion
    from hf_heads.core.ops import triton_rows

    kernel_calls = []
    for name in ("row_stats", "tree_mix"):
        original = getattr(triton_rows, name)
        monkeypatch.setattr(triton_rows, name, lambda *a, f=original, n=name, **k: kernel_calls.append(n) or f(*a, **k))
    kernels = triton_rows.triton_installed() and triton_rows.interpreting()

    train_lm(data, tmp_path, "mixtape", updates=1)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(tmp_path / "checkpoint_last.pt")])
    model = models[0].train()
    for m in model.modules():
        if hasattr(m, "p") and isinstance(m.p, float):
            m.p = 0.0  # fairseq's dropout modules
    head = model.decoder.output_head if hasattr(model.decoder, "output_head") else None
    head = head or next(m for m in model.modules() if m.__class__.__name__.endswith("Head"))
    head.config.gate_noise = 0.0
    pad = task.target_dictionary.pad()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, len(task.target_dictionary), (3, 10), generator=g)
    target = torch.randint(4, len(task.target_dictionary), (3, 10), generator=g)
    target[0, 7:] = pad
    sample = {
        "net_input": {"src_tokens": tokens, "src_lengths": torch.full((3,), 10)},
        "target": target,
        "ntokens": int(target.ne(pad).sum()),
    }
    criterion = HeadCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=eps)
    results = []
    for lean, kernel in [(False, None), (True, None)] + [(True, "triton")] * kernels:
        head.lean_loss, head.lean_kernel = lean, kernel
        model.zero_grad()
        loss, _, _ = criterion(model, sample)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (ref_loss, ref_grads), *lean_results = results
    for lean_loss, lean_grads in lean_results:
        torch.testing.assert_close(lean_loss, ref_loss, rtol=1e-5, atol=1e-5)
        assert len(lean_grads) == len(ref_grads)
        for a, b in zip(lean_grads, ref_grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert set(kernel_calls) == ({"row_stats", "tree_mix"} if kernels else set())  # only with lean_kernel, both ran


def _valid_losses(out):
    """``{epoch: valid loss}`` of a fairseq-train log (``--log-format simple``)."""
    return {int(e): float(v) for e, v in re.findall(r"epoch (\d+) \| valid on 'valid' subset \| loss ([\d.]+)", out)}


@pytest.mark.long
def test_patience_counts_across_a_resumed_run(data, tmp_path):
    """--patience stops a resumed run where the same run stops uninterrupted: the plugin keeps fairseq's count
    in the checkpoint (fairseq alone would count again from the first validation after the resume)."""
    stop = ["--patience", "2", "--lr", "0.01", "--max-update", "100000"]
    whole = train_lm(data, tmp_path / "whole", "softmax", *stop, "--max-epoch", "60")
    losses = _valid_losses(whole)
    best = min(losses, key=losses.get)
    assert "early stop since valid performance hasn't improved for last 2 runs" in whole, whole[-3000:]
    assert max(losses) == best + 2  # stopped two validations after its best
    train_lm(data, tmp_path / "cut", "softmax", *stop, "--max-epoch", str(best + 1))  # interrupted after the best
    resumed = train_lm(data, tmp_path / "cut", "softmax", *stop, "--max-epoch", "60")
    after = _valid_losses(resumed)  # (fairseq's resume is not bit-exact: the losses may differ in the last digit)
    assert list(after) == [best + 2], (losses, after)  # one epoch, then stops; without the plugin: best + 4 or later
    assert "early stop" in resumed
