"""``softmax-heads bench`` (hf_heads/cli/bench.py) at a tiny size on the CPU: every entry's time and memory against
the plain output layer, the loss of the heads that must equal it, the files it writes, and its errors."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from hf_heads.cli import bench

HEADS = ["softmax (ours)", "mos K=3", "class_softmax"]


def test_the_benchmark_times_and_measures_each_head_against_the_plain_layer(tmp_path):
    argv = ["--tokens", "64", "--dim", "16", "--vocab", "300", "--heads", *HEADS, "--rounds", "2"]
    out = bench.main(argv + ["--out", str(tmp_path)], log=lambda *_: None)
    (label,) = out["settings"]
    assert label == "d=16 V=300 float32"
    setting = out["settings"][label]
    rows, errors = setting["rows"], setting["errors"]
    assert {bench.BASELINE, *HEADS} <= set(rows)
    for peer in (bench.TORCH_LCE, bench.LIGER, bench.CCE):  # each fused loss ran or says why not
        assert peer in rows or errors[peer]
    assert rows[bench.BASELINE]["time_ratio"] == 1.0 and all(r["ms"] > 0 for r in rows.values())
    assert all(r["peak_mib"] >= 0 for r in rows.values())  # measured in the child process, for every entry
    # our softmax is given the plain layer's W: the same loss (a head that ignored it would differ); MoS is not
    assert abs(rows["softmax (ours)"]["loss_minus_baseline"]) < 1e-5
    assert "loss_minus_baseline" not in rows["mos K=3"] and rows["mos K=3"]["loss"] != rows[bench.BASELINE]["loss"]
    if bench.TORCH_LCE in rows:
        assert abs(rows[bench.TORCH_LCE]["loss_minus_baseline"]) < 1e-5
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["settings"][label]["rows"].keys() == rows.keys() and saved["args"]["tokens"] == 64
    table = (tmp_path / "table.md").read_text()
    assert f"**{label}, N = 64**" in table and "| mos K=3 | " in table and f"| {bench.BASELINE} | 1.00x" in table


def test_the_baseline_is_the_plain_output_layer_and_the_heads_get_its_weight():
    """The entries' losses by hand: the baseline is F.cross_entropy over x W^T; our softmax has that W."""
    args = bench.parse_args(["--tokens", "8", "--shapes", "4x10"])
    setting = bench.output_layer(4, 10, torch.float32, args, ["softmax (ours)"], peers=False)
    expected = F.cross_entropy(setting.hidden @ setting.linear.weight.T, setting.target)
    assert torch.allclose(setting.entries[bench.BASELINE].loss(), expected)
    assert torch.allclose(setting.entries["softmax (ours)"].loss(), expected, atol=1e-6)
    assert setting.linear.bias is None and setting.missing == {}


def test_the_settings_and_the_defaults_follow_the_device():
    cpu = bench.parse_args([])
    assert (cpu.tokens, cpu.dim, cpu.vocab, cpu.dtype) == (2048, [512], [10000, 33000, 50257], ["float32"])
    assert [s[0] for s in bench.settings(cpu)] == [
        "d=512 V=10000 float32",
        "d=512 V=33000 float32",
        "d=512 V=50257 float32",
    ]
    shapes = bench.parse_args(["--shapes", "2048x50000", "576x49152", "--dtype", "bfloat16"])
    assert [s[0] for s in bench.settings(shapes)] == ["d=2048 V=50000 bfloat16", "d=576 V=49152 bfloat16"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tokens", "0"], "--tokens 0: must be at least 1"),
        (["--vocab", "10", "-5"], "--vocab -5: must be at least 1"),
        (["--shapes", "2048by50000"], "expected DxV"),
        (["--heads", "mos"], "invalid choice: 'mos'"),
    ],
)
def test_a_bad_option_is_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_a_gpu_without_cuda_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cuda"])
    assert "--device cuda: CUDA is not available" in capsys.readouterr().err
