"""The project's benchmark (benchmarks/heads.py) at a tiny size on the CPU: the CPU path with its busy neighbour, and
the GPU path's every column and row through ``--device cpu`` (the Triton rows through the interpreter). Its CUDA
runs are the GPU check (docs/testing.md)."""

from __future__ import annotations

import json

import pytest

from hf_heads.cli.bench import CCE, LIGER, TORCH_LCE


def test_device_benchmark_runs_on_the_cpu(tmp_path):
    """Every column and row of the GPU benchmark at a tiny size: the Triton rows through the interpreter, the
    reference rows, the roofline, the peers, the whole-model step (a 1-layer SmolLM2-shaped Llama) and the targets."""
    from benchmarks import heads as bench_heads

    heads = ["softmax (ours)", "mos K=3", "mixtape K=4 r=0.1 d2=64", "class_softmax"]
    out = bench_heads.main(
        ["--device", "cpu", "--tokens", "24", "--dim", "16", "--vocab", "40", "--dtype", "float32", "bfloat16"]
        + ["--heads", *heads, "--rounds", "1", "--repeats", "1", "--warmup", "1", "--out", str(tmp_path)]
        + ["--model-layers", "1", "--model-dim", "16", "--model-vocab", "40", "--model-tokens", "16"],
        log=lambda *_: None,
    )
    assert list(out["settings"]) == ["d=16 V=40 float32", "d=16 V=40 bfloat16"]
    rows = out["settings"]["d=16 V=40 float32"]["rows"]
    assert {bench_heads.BASELINE, *heads, "mos K=3 [triton]", "mos K=3 [reference]"} <= set(rows)
    assert rows[bench_heads.BASELINE]["time_ratio"] == 1.0 and rows["mos K=3"]["ms"] > 0
    # our softmax has the baseline's W and b: the same loss in float32 (a head that ignored them would differ), by the
    # kernels and by autograd too
    for entry in ("softmax (ours)", "softmax (ours) [triton]", "softmax (ours) [reference]"):
        assert abs(rows[entry]["loss_minus_baseline"]) < 1e-5, entry
    for name in heads[:2]:  # the kernels compute the same loss as the lean loss (Mixtape's gate noise differs)
        assert abs(rows[f"{name} [triton]"]["loss"] - rows[name]["loss"]) < 1e-5, name
    assert rows["mos K=3"]["memory_ratio"] is None  # memory is CUDA's allocator's: not measured on the CPU
    # the roofline: the plain step's products are 6 N d V FLOPs; MoS-3's and Mixtape's more; every row has its ratio
    assert rows[bench_heads.BASELINE]["flops"] == 6 * 24 * 16 * 40
    assert rows["mos K=3"]["flops"] > 3 * rows["softmax (ours)"]["flops"]
    assert rows["mos K=3"]["vwide_values"] == 3 * 24 * 40
    assert all(r["over_roofline"] > 0 and r["roofline_ms"] > 0 for n, r in rows.items() if "class_softmax" not in n)
    # a head whose rows are grouped on the host has no roofline (its work depends on the targets) and no kernels
    assert (
        rows["class_softmax"]["roofline_ms"] is None
        and "no Triton kernels" in out["settings"]["d=16 V=40 float32"]["errors"]["class_softmax [triton]"]
    )
    # the float32 W accumulator of the lean loss is reported apart: 4 bytes a parameter
    assert rows["softmax (ours)"]["accumulators_mib"] == 4 * 16 * 40 / 2**20
    # every peer either ran or says why not (x-transformers' MoS is a peer of MoS-3)
    for setting in out["settings"].values():
        for peer in (TORCH_LCE, LIGER, CCE, bench_heads.PEER):
            assert peer in setting["rows"] or setting["errors"][peer]
    # bf16: each head again with its V-wide products in bf16 (float32 results), near the float32 products' loss
    low = out["settings"]["d=16 V=40 bfloat16"]["rows"]
    assert {"softmax (ours) [bfloat16 products]", "mos K=3 [bfloat16 products, triton]"} <= set(low)
    assert "softmax (ours) [bfloat16 products]" not in rows  # not for float32
    assert abs(low["softmax (ours) [bfloat16 products]"]["loss"] - low["softmax (ours)"]["loss"]) < 0.05
    # the whole-model step: the plain model, Liger's, each head by default and with the kernels
    model = out["model"]["rows"]
    assert {bench_heads.PLAIN_MODEL, "mos K=3", "mixtape K=4 r=0.1 d2=64 [bfloat16 products, triton]"} <= set(model)
    assert bench_heads.LIGER_MODEL in model or out["model"]["errors"][bench_heads.LIGER_MODEL]
    assert model[bench_heads.PLAIN_MODEL]["time_ratio"] == 1.0 and model["mos K=3"]["tokens_per_s"] > 0
    assert out["model"]["config"]["num_hidden_layers"] == 1 and out["model"]["config"]["vocab_size"] == 40
    goals = {t["target"]: t for t in out["targets"]}
    for goal in (
        "time mos K=3 [bfloat16 products] / softmax (ours) [bfloat16 products]",
        "time mos K=3 [bfloat16 products, triton] / softmax (ours) [bfloat16 products, triton]",
        f"time/roofline mos K=3 / {bench_heads.BASELINE}'s",
        f"time mixtape K=4 r=0.1 d2=64 [bfloat16 products, triton] / {bench_heads.PLAIN_MODEL}",
    ):
        assert goal in goals, goal
    assert goals["time mos K=3 / softmax (ours)"]["goal"] == pytest.approx(1.1 * 3)
    assert goals["time mos K=3 / softmax (ours)"]["setting"] == "d=16 V=40 bfloat16"
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["settings"].keys() == out["settings"].keys() and saved["model"]["rows"].keys() == model.keys()
    table = (tmp_path / "table.md").read_text()
    assert "**d=16 V=40 bfloat16**" in table and "| mos K=3 [triton] |" in table and "Targets" in table
    assert "**Whole-model training step" in table


def test_device_benchmark_takes_shapes():
    from benchmarks import heads as bench_heads

    args = bench_heads.parse_args(["--device", "cpu", "--shapes", "2048x50000", "576x49152", "--dtype", "bfloat16"])
    assert [s[0] for s in bench_heads.device_settings(args)] == ["d=2048 V=50000 bfloat16", "d=576 V=49152 bfloat16"]
    assert args.model_vocab == 49152 and args.model_layers == 30  # SmolLM2-135M's shape on a device
    with pytest.raises(SystemExit):
        bench_heads.parse_args(["--device", "cpu", "--shapes", "2048by50000"])


def test_device_benchmark_names_the_option_it_refuses():
    from benchmarks import heads as bench_heads

    with pytest.raises(SystemExit):
        bench_heads.parse_args(["--device", "cpu", "--tokens", "0"])


def test_training_cost_benchmark_tiny_run(tmp_path):
    from benchmarks import heads as bench_heads

    res = bench_heads.main(
        [
            "--vocab",
            "500",
            "--tokens",
            "64",
            "--dim",
            "32",
            "--heads",
            "softmax (ours)",
            "mos K=3",
            "--no-model",
            "--no-peer",
            "--rounds",
            "1",
            "--memory-repeats",
            "1",
            "--out",
            str(tmp_path),
            "--busy",
        ],
        log=lambda *_: None,
    )
    rows = res["V=500"]
    assert set(rows) == {bench_heads.BASELINE, "softmax (ours)", "mos K=3"}
    assert rows[bench_heads.BASELINE]["time_ratio"] == 1.0 and rows[bench_heads.BASELINE]["memory_ratio"] == 1.0
    assert all(r["ms"] > 0 and r["peak_mib"] >= 0 for r in rows.values())
    assert "| mos K=3 |" in (tmp_path / "table.md").read_text()
    busy = json.loads((tmp_path / "results.json").read_text())["busy"]["V=500"]
    assert busy[bench_heads.BASELINE]["relative_slowdown"] == 1.0 and busy["mos K=3"]["busy_s"] > 0
    assert "| V=500 | mos K=3 |" in (tmp_path / "table.md").read_text().split("busy neighbour")[1]
