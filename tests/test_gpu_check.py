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
    """The GPU machine runs the trl, liger-kernel and x-transformers that `make install` pins (setup.cfg's clients
    and bench extras)."""
    wheels = dict(
        line.split("==")
        for line in open(os.path.join(ROOT, "scripts", "gpu_wheels.txt"))
        if line.strip() and not line.startswith("#")
    )
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    extras = config["options.extras_require"]
    pins = dict(re.findall(r"^\s*([\w-]+)==([\w.]+)", extras["clients"] + extras["bench"], re.M))
    for name in ("trl", "liger-kernel", "x-transformers"):
        assert wheels[name].strip() == pins[name], name
