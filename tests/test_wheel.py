"""The wheel (issue 78): built from this checkout it holds the library (with its commands) and the fairseq plugin,
not the recipes; installed on its own into a folder, its ``softmax-heads`` console script runs, and a fairseq
checkpoint saved with the plugin (softmax-heads 0.1.0's, tests/data/saved_0_1_0) loads with ``--user-dir`` from
``softmax-heads fairseq-user-dir`` and scores as saved, in a process that sees no checkout."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "saved_0_1_0")
SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "hf_heads", "fairseq_plugin", "recipes")

LOAD = """
import sys, torch, hf_heads
from fairseq.models.transformer_lm import TransformerLanguageModel
folder, user_dir, expected = sys.argv[1:]
print(hf_heads.__file__)
expected = torch.load(expected, weights_only=True)
lm = TransformerLanguageModel.from_pretrained(folder, "checkpoint_best.pt", user_dir=user_dir).eval()
net = lm.models[0]
with torch.no_grad():
    lp = net.get_normalized_probs(net(lm.encode(expected["sentence"])[None]), log_probs=True)
torch.testing.assert_close(lp, expected["log_probs"], rtol=1e-5, atol=1e-5)
print(net.decoder.head.head_name)
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(wheel, site)``: the wheel built from a copy of this checkout's sources, and a folder it is installed into."""
    pytest.importorskip("setuptools", reason="building the wheel without isolation needs setuptools (pip install it)")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:  # a copy: building writes build/ and egg-info beside the sources; recipes/ to be left out
        path = os.path.join(ROOT, name)
        if os.path.isdir(path):
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    run = subprocess.run(
        [*pip, "wheel", str(src), "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    (wheel,) = (tmp / "dist").glob("softmax_heads-*.whl")
    site = tmp / "site"
    run = subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(site), str(wheel)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    return wheel, site


def test_the_wheel_holds_the_library_the_plugin_and_the_command_not_the_recipes(installed):
    wheel, _ = installed
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = z.read(entry_points).decode()
        texts = {n: z.read(n).decode() for n in names if n.endswith((".py", ".json", ".txt", ".md"))}
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"hf_heads", "fairseq_plugin"}, tops
    assert "hf_heads/cli/__main__.py" in names and "fairseq_plugin/checkpoint.py" in names
    for name, text in texts.items():  # the wheel names no issue and no planning document
        assert not re.search(r"\bissues? #?\d+|planning|ROADMAP", text, re.I), name
    assert "softmax-heads = hf_heads.cli.__main__:console" in scripts


def test_the_installed_command_and_plugin_work_without_the_checkout(installed, tmp_path):
    pytest.importorskip("fairseq", reason="fairseq not installed: run `make install`")
    _, site = installed
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    script = site / "bin" / "softmax-heads"
    run = subprocess.run([str(script), "fairseq-user-dir"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    user_dir = run.stdout.strip()
    assert user_dir == str(site / "fairseq_plugin")
    run = subprocess.run([str(script), "finetune", "--help"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0 and "usage: softmax-heads finetune" in run.stdout, run.stderr
    for f in ("dict.txt", "checkpoint_best.pt"):
        shutil.copy(os.path.join(DATA, "fairseq_lm", f), tmp_path / f)
    expected = os.path.join(DATA, "fairseq_expected.pt")
    run = subprocess.run(
        [sys.executable, "-c", LOAD, str(tmp_path), user_dir, expected],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    where, head = run.stdout.strip().splitlines()[-2:]
    assert where.startswith(str(site)), where  # the installed library, not the checkout
    assert head == "mixtape"
