"""The core is torch-only; fairseq and transformers live together in one environment."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str, extra_path: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, ROOT, env.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )


def test_core_works_without_transformers_and_fairseq():
    proc = run_python("""
        import sys
        for name in ('transformers', 'fairseq', 'fairseq_cli', 'accelerate'):
            sys.modules[name] = None  # as if not installed: find_spec -> None, import -> ImportError
        import torch, hf_heads
        for name in hf_heads.available_heads():
            head = hf_heads.build_head(name, hidden_size=8, vocab_size=20)
            loss = head.loss(torch.randn(3, 8), torch.tensor([1, 2, 3]))
            loss.backward()
            assert torch.isfinite(loss), name
        adapters = ('transformers', 'fairseq')
        bad = [m for m, mod in sys.modules.items() if m.split('.')[0] in adapters and mod is not None]
        assert not bad, bad
        try:
            hf_heads.swap_head(None, 'mos')
        except ImportError as e:
            assert "pip install 'softmax-heads[hf]'" in str(e)
        else:
            raise AssertionError('swap_head without transformers must raise ImportError')
        print('ok', len(hf_heads.available_heads()))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok")


def _fake_broken_torchaudio(tmp_path):
    pkg = tmp_path / "torchaudio"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise OSError('Could not load this library: _torchaudio.abi3.so (fake)')\n")
    return str(tmp_path)


def test_compat_detects_a_broken_torchaudio(tmp_path):
    proc = run_python(
        """
        import sys
        sys.path.insert(0, "scripts")
        from fix_torchaudio import torchaudio_import_error
        print(torchaudio_import_error())
    """,
        extra_path=_fake_broken_torchaudio(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert "Could not load this library" in proc.stdout


def test_the_recipes_hide_a_broken_torchaudio_from_transformers_and_hf_heads_does_not(tmp_path):
    """Every recipe (``recipes/__init__.py``) hides a torchaudio that cannot load, so transformers' model code works in
    the processes this project starts; ``import hf_heads`` alone hides nothing (its users run `make install`, which
    uninstalls such a torchaudio, or ``python scripts/fix_torchaudio.py --fix``)."""
    pytest.importorskip("transformers", reason="transformers not installed (pip install -e .[hf])")
    proc = run_python(
        """
        import importlib.util
        import recipes, torch
        assert importlib.util.find_spec('torchaudio') is None
        from transformers import GPT2Config, GPT2LMHeadModel
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40,
                                           bos_token_id=0, eos_token_id=0))
        # min_new_tokens: a random model may emit eos (id 0) early, which would end the output sooner
        out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, min_new_tokens=4, do_sample=False,
                             pad_token_id=0)
        assert out.shape == (1, 7), out.shape
        print('ok')
    """,
        extra_path=_fake_broken_torchaudio(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    code = "import importlib.util, sys, hf_heads; print(importlib.util.find_spec('torchaudio') is not None)"
    proc = run_python(code, extra_path=str(tmp_path))  # the same broken torchaudio
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr[-3000:]


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("fairseq", "transformers")),
    reason="fairseq or transformers not installed: run `make install` (pip install -e .[all])",
)
def test_fairseq_and_transformers_work_in_one_environment():
    """What `pip install -e .[all]` + `make install` give: both import, and generate works,
    without importing hf_heads first (so the installed torchaudio itself must be fine)."""
    proc = run_python("""
        import torch
        import fairseq
        from fairseq.models.transformer_lm import TransformerLanguageModel
        from transformers import GPT2Config, GPT2LMHeadModel
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40,
                                           bos_token_id=0, eos_token_id=0))
        for kw in ({'do_sample': False}, {'do_sample': True, 'top_k': 5}, {'num_beams': 2}):
            # min_new_tokens: a random model may emit eos (id 0) early, which would end the output sooner
            out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, min_new_tokens=3, pad_token_id=0,
                                 **kw)
            assert out.shape[1] == 6, (kw, out.shape)
        print('ok', fairseq.__version__)
    """)
    assert proc.returncode == 0, (
        "fairseq + transformers do not work together here; if torchaudio is the cause, run "
        "`make install` (it uninstalls a torchaudio that cannot load)\n" + proc.stderr[-3000:]
    )
