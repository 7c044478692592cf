"""The repository's two wings, as the README's Layout section describes them: the product (hf_heads/, fairseq_plugin/,
recipes/) in front, the lab (studies/, benchmarks/) beside it; short functions; a small user benchmark."""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the folders of Python code outside the tests
CODE = ("hf_heads", "fairseq_plugin", "recipes", "studies", "benchmarks", "scripts")


def _python_files(folders):
    for folder in folders:
        for base, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = [d for d in dirs if not d.startswith((".", "__pycache__"))]
            yield from (os.path.join(base, f) for f in files if f.endswith(".py"))


def test_no_function_outside_the_tests_is_over_80_lines():
    long = []
    for path in _python_files(CODE):
        if os.path.basename(path).startswith("test_"):
            continue
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_recipes_hold_the_tables_the_demo_and_the_shared_runtime_only():
    """recipes/: python -m recipes.reproduce, the demo and recipes/common; a study goes to studies/, a benchmark
    instrument to benchmarks/, and a library command is installed (softmax-heads), not aliased here."""
    top = sorted(n for n in os.listdir(os.path.join(ROOT, "recipes")) if not n.startswith(("_", ".")))
    assert top == ["common", "reproduce", "synthetic_bottleneck.py"], top
    studies = sorted(n for n in os.listdir(os.path.join(ROOT, "studies")) if not n.startswith(("_", ".")))
    assert {"bottleneck_map", "head_upgrade", "fast_softmax", "bf16_products", "mixtape_forms"} <= set(studies)


def test_the_library_benchmark_stays_a_users_benchmark():
    """softmax-heads bench: each head against the plain output layer and the fused peers, at most about 400 lines;
    the rooflines, targets and device tables are the checkout's benchmarks/."""
    with open(os.path.join(ROOT, "hf_heads", "cli", "bench.py")) as f:
        text = f.read()
    assert len(text.splitlines()) <= 410
    assert "def rooflines" not in text and "targets.json" not in text
