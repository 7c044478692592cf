"""Models that load without softmax-heads: ``save_pretrained`` writes the head's code beside the weights.

transformers loads a custom architecture from files saved with the model ("remote code"): ``config.json``'s
``auto_map`` names a configuration and a modeling file in the folder, and ``from_pretrained(dir,
trust_remote_code=True)`` imports them, together with every file they import as ``from .name import ...``
(transformers copies only those, flat, and refuses a file importing a package that is not installed). A head
model's ``save_pretrained`` (and so ``push_to_hub`` and ``Trainer.save_model``) therefore writes:

* ``softmax_heads_<package>_<module>.py``: the package's torch-only core, every head and the transformers
  adapter's runtime, flattened into one folder with their relative imports rewritten (``from ..core import x``
  becomes ``from .softmax_heads_core import x``); they import only torch, transformers and the standard library;
* ``configuration_softmax_heads.py`` and ``modeling_softmax_heads.py``: the model's config and model class
  (e.g. ``SoftmaxHeadsGPT2LMHeadModel``, a subclass of ``GPT2LMHeadModel``), built by the same code;
* ``auto_map`` in ``config.json``: ``AutoConfig`` and the model's Auto class (``AutoModelForCausalLM`` or
  ``AutoModelForSeq2SeqLM``).

In a process that ran ``import hf_heads``, ``from_pretrained(dir)`` uses the installed package, as before, also
with ``trust_remote_code=True`` (transformers prefers a model type registered in the process); elsewhere,
``trust_remote_code=True`` uses the files saved with the model. A model loaded from those files saves them again
(this module is among them).
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
from typing import Dict, List, Tuple

PREFIX = "softmax_heads"
CONFIG_FILE = "configuration_softmax_heads"
MODELING_FILE = "modeling_softmax_heads"
#: the package's modules a saved model needs (its transformers runtime, not the Auto registration or converters)
PACKAGES = ("core", "heads")
HF_MODULES = (
    "checkpoint",
    "config",
    "lean_forward",
    "liger",
    "modeling",
    "output_layer",
    "peft",
    "remote_code",
    "resize",
    "tensor_parallel",
    "trl",
)
#: what transformers follows to find the files to copy (transformers.dynamic_module_utils.get_relative_imports)
RELATIVE_IMPORT = re.compile(r"^\s*from\s+\.(\S+)\s+import", re.MULTILINE)


def _package_root() -> str:
    """The ``hf_heads`` folder when this module runs from the installed package, else ``""`` (from saved files)."""
    if __package__ and __package__.split(".")[-2:] == ["hf_heads", "hf"]:
        return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return ""


def flat_name(module: str) -> str:
    """``hf_heads.core.lean`` -> ``softmax_heads_core_lean`` (a package is named by its ``__init__``)."""
    parts = module.split(".")
    assert parts[0] == "hf_heads", module
    return "_".join([PREFIX] + parts[1:])


def _package_modules(root: str) -> Dict[str, str]:
    """``{dotted module name: file}`` of the modules a saved model needs (sub-packages included, e.g. core.ops)."""
    modules = {}
    for package in PACKAGES:
        top = os.path.join(root, package)
        for folder, subfolders, files in os.walk(top):
            subfolders[:] = sorted(d for d in subfolders if os.path.isfile(os.path.join(folder, d, "__init__.py")))
            rel = os.path.relpath(folder, top)
            dotted = ".".join(["hf_heads", package, *([] if rel == "." else rel.split(os.sep))])
            for file in sorted(files):
                if file.endswith(".py"):
                    modules[dotted + ("" if file == "__init__.py" else "." + file[:-3])] = os.path.join(folder, file)
    for module in HF_MODULES:
        modules[f"hf_heads.hf.{module}"] = os.path.join(root, "hf", module + ".py")
    return modules


def _rewrite_imports(source: str, module: str, modules: Dict[str, str]) -> str:
    """``source`` of ``module`` with each relative import pointing at the flat file of its target. A module bound
    by name (``from ..core import lean``) becomes ``from . import softmax_heads_core_lean as lean``."""
    package = module if modules[module].endswith("__init__.py") else module.rsplit(".", 1)[0]
    lines = source.splitlines(keepends=True)
    edits: List[Tuple[int, int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
        target = f"{base}.{node.module}" if node.module else base
        indent = " " * node.col_offset
        names, out = [], []
        for alias in node.names:
            if f"{target}.{alias.name}" in modules:  # a module bound by name
                out.append(
                    f"{indent}from . import {flat_name(target + '.' + alias.name)} as {alias.asname or alias.name}\n"
                )
            else:
                names.append(alias.name + (f" as {alias.asname}" if alias.asname else ""))
        if names:
            if target not in modules:
                raise ValueError(f"{module}: imports {target}, which a saved model does not carry")
            out.insert(0, f"{indent}from .{flat_name(target)} import {', '.join(names)}\n")
        edits.append((node.lineno - 1, node.end_lineno, "".join(out)))
    for start, end, text in sorted(edits, reverse=True):
        lines[start:end] = [text]
    return "".join(lines)


def _version() -> str:
    root = _package_root()
    if root:
        import importlib

        return importlib.import_module(__package__.rsplit(".", 1)[0]).__version__
    return VERSION


VERSION = "unknown"  # the package's version, written here when the files are saved


def code_files() -> Dict[str, str]:
    """``{file name: source}`` of the package's code a saved model carries: from the installed package (rewritten
    flat), or, when this module runs from a saved model's files, those files as they are."""
    root = _package_root()
    here = os.path.dirname(os.path.abspath(__file__))
    if not root:
        return {
            f: open(os.path.join(here, f), encoding="utf-8").read()
            for f in sorted(os.listdir(here))
            if f.startswith(PREFIX + "_") and f.endswith(".py")
        }
    stamped = tuple((module, path, os.stat(path).st_mtime_ns) for module, path in _package_modules(root).items())
    return dict(_rewritten(stamped))


@functools.lru_cache(maxsize=4)
def _rewritten(stamped: Tuple[Tuple[str, str, int], ...]) -> Dict[str, str]:
    """:func:`code_files` from the installed package: each ``(module, file, modification time)`` read and rewritten
    once per process while its file stays as it was (a save then costs no parsing)."""
    modules = {module: path for module, path, _ in stamped}
    files = {}
    for module, path in modules.items():
        with open(path, encoding="utf-8") as f:
            source = _rewrite_imports(f.read(), module, modules)
        if module == __name__:
            source = re.sub(r'^VERSION = "[^"]*"', f'VERSION = "{_version()}"', source, count=1, flags=re.MULTILINE)
        files[flat_name(module) + ".py"] = source
    return files


def _entry_files(model_class: type, auto_class: str, carried: List[str]) -> Dict[str, str]:
    """The configuration and modeling files ``auto_map`` names, for ``model_class`` (``SoftmaxHeads<Base>``); the
    modeling file imports each of the ``carried`` files (names of :func:`code_files`)."""
    base_model = model_class._head_base_class.__name__
    config_class = model_class.config_class
    base_config = config_class.__mro__[1].__name__
    header = (
        f'"""{{what}} of a {base_model} whose output layer is a softmax-heads head, loadable without the '
        f"softmax-heads package:\n{auto_class}.from_pretrained(folder, trust_remote_code=True). Written by "
        f"softmax-heads {_version()} when the model was saved; the softmax_heads_*.py files beside it are that "
        f'version\'s code (torch and transformers only)."""\n'
    )
    config = (
        header.format(what="The config") + f"from transformers import {base_config}\n\n"
        f"from .{PREFIX}_hf_config import head_config_class\n\n"
        f"{config_class.__name__} = head_config_class({base_config})\n"
    )
    # one `from .x import` line per file: what makes transformers copy each of them (and import every head)
    imports = "".join(f"from .{name[:-3]} import __name__ as _  # noqa: F401\n" for name in carried)
    modeling = (
        header.format(what="The model")
        + f"from transformers import {base_model}\n\n"
        + imports
        + f"from .{CONFIG_FILE} import {config_class.__name__}  # noqa: F401\n"
        f"from .{PREFIX}_hf_modeling import head_model_class\n\n"
        f"{model_class.__name__} = head_model_class({base_model})\n"
    )
    return {CONFIG_FILE + ".py": config, MODELING_FILE + ".py": modeling}


def auto_map(model_class: type, auto_class: str) -> Dict[str, str]:
    """``config.auto_map`` of a saved head model: the classes ``trust_remote_code=True`` loads."""
    return {
        "AutoConfig": f"{CONFIG_FILE}.{model_class.config_class.__name__}",
        auto_class: f"{MODELING_FILE}.{model_class.__name__}",
    }


def write_code(folder: str, model_class: type, auto_class: str) -> List[str]:
    """Write the files of a model saved in ``folder`` (see the module docstring) and point ``config.json``'s
    ``auto_map`` at them; returns the file names written."""
    code = code_files()  # (rewritten once per process: _rewritten)
    files = {**code, **_entry_files(model_class, auto_class, sorted(code))}
    for name, source in files.items():
        missing = [m for m in RELATIVE_IMPORT.findall(source) if m + ".py" not in files and m != "."]
        if missing:
            raise RuntimeError(f"{name} imports {missing}, which are not among the files saved with the model")
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(source)
    config_path = os.path.join(folder, "config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config["auto_map"] = auto_map(model_class, auto_class)
    with open(config_path, "w", encoding="utf-8") as f:
        f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return sorted(files)
