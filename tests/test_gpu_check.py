"""The GPU entry points, run where CI runs (no GPU): ``make test-gpu``'s pytest option, the benchmark's device mode
with ``--device cpu``, and scripts/gpu_check.sh failing loudly without CUDA. Their CUDA runs are the GPU check
(docs/testing.md)."""

from __future__ import annotations

import configparser
import json
import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here: `make test-gpu` runs the tier")
def test_cuda_tier_without_cuda_says_why_it_did_not_run():
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_device.py", "--device", "cuda", "-p", "no:xdist", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "--device cuda: the CUDA tier did not run: CUDA is not available here" in run.stdout + run.stderr
    assert " passed" not in run.stdout  # nothing ran


def test_device_benchmark_runs_on_the_cpu(tmp_path):
    from recipes import bench_heads

    out = bench_heads.main(
        [
            "--device",
            "cpu",
            "--tokens",
            "48",
            "--dim",
            "16",
            "--vocab",
            "40",
            "--dtype",
            "float32",
            "bfloat16",
            "--heads",
            "softmax (ours)",
            "mos K=3",
            "plif T=1e5",
            "--rounds",
            "1",
            "--repeats",
            "1",
            "--warmup",
            "1",
            "--out",
            str(tmp_path),
        ],
        log=lambda *_: None,
    )
    assert list(out["settings"]) == ["d=16 V=40 float32", "d=16 V=40 bfloat16"]
    rows = out["settings"]["d=16 V=40 float32"]["rows"]
    assert {bench_heads.BASELINE, "softmax (ours)", "mos K=3", "plif T=1e5"} <= set(rows)
    assert rows[bench_heads.BASELINE]["time_ratio"] == 1.0 and rows["mos K=3"]["ms"] > 0
    # our softmax has the baseline's W and b: the same loss in float32 (a head that ignored them would differ)
    assert abs(rows["softmax (ours)"]["loss_minus_baseline"]) < 1e-5
    assert rows["mos K=3"]["memory_ratio"] is None  # memory is CUDA's allocator's: not measured on the CPU
    # every peer either ran or says why not
    for setting in out["settings"].values():
        for peer in (bench_heads.TORCH_LCE, bench_heads.LIGER, bench_heads.CCE):
            assert peer in setting["rows"] or setting["errors"][peer]
    # bf16: each head again with its V-wide products in bf16 (float32 results), near the float32 products' loss
    low = out["settings"]["d=16 V=40 bfloat16"]["rows"]
    assert {"softmax (ours) [bfloat16 products]", "mos K=3 [bfloat16 products]"} <= set(low)
    assert "softmax (ours) [bfloat16 products]" not in rows  # not for float32
    assert abs(low["softmax (ours) [bfloat16 products]"]["loss"] - low["softmax (ours)"]["loss"]) < 0.05
    goals = {t["target"]: t for t in out["targets"]}
    assert "time mos K=3 [bfloat16 products] / softmax (ours) [bfloat16 products]" in goals
    assert (
        goals["time mos K=3 / softmax (ours)"]["goal"] == 3.0
        and goals["time mos K=3 / softmax (ours)"]["setting"] == "d=16 V=40 bfloat16"
    )
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["settings"].keys() == out["settings"].keys()
    table = (tmp_path / "table.md").read_text()
    assert "**d=16 V=40 bfloat16**" in table and "| mos K=3 |" in table and "Targets" in table


def test_device_benchmark_names_the_option_it_refuses():
    from recipes import bench_heads

    with pytest.raises(SystemExit):
        bench_heads.parse_args(["--device", "cpu", "--tokens", "0"])


def test_gpu_check_fails_loudly_without_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: bash scripts/gpu_check.sh OUT runs the check itself")
    run = subprocess.run(
        ["bash", "scripts/gpu_check.sh", str(tmp_path), "5", "5"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 1
    assert "FAILED: CUDA is not available here" in (tmp_path / "gpu_check.log").read_text()
    assert json.loads((tmp_path / "machine.json").read_text())["cuda_available"] is False


def test_gpu_wheels_pin_the_clients_extras_versions():
    """The GPU machine runs the trl and liger-kernel that `make install` pins (setup.cfg's clients extra)."""
    wheels = dict(
        line.split("==")
        for line in open(os.path.join(ROOT, "scripts", "gpu_wheels.txt"))
        if line.strip() and not line.startswith("#")
    )
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    pins = dict(re.findall(r"^\s*([\w-]+)==([\w.]+)", config["options.extras_require"]["clients"], re.M))
    for name in ("trl", "liger-kernel"):
        assert wheels[name].strip() == pins[name], name
