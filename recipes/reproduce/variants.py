"""Head variants of the reproduced tables: a registry head with the options a table gives it.

A table names its heads as the papers do: the registry's names (``softmax``, ``mixtape``, ``plif``, ...) plus
variants such as ``mos-9`` (MoS with K = 9 components), ``mixtape-noshare`` (Mixtape without gate sharing:
every token has its own gate priors, r = 1) and ``mixtape-unscaled`` (Mixtape with ``scaled_input=False``: its
projections in torch's ``nn.Linear`` form instead of Mesh TensorFlow's; see ``MixtapeConfig``). The table's own
options for a head (its dropouts, the paper's r) come first; a variant's options are applied on top.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Sequence

import hf_heads


@dataclass(frozen=True)
class Variant:
    """A head as a table runs it: ``name`` (as in results and file names), registry ``head``, its ``options``."""

    name: str
    head: str
    options: Dict[str, Any] = field(default_factory=dict)


def _parse(name: str):
    """``(registry head, variant options)`` of a variant name, or None."""
    m = re.fullmatch(r"mos(_plif)?-(\d+)", name)
    if m:
        return ("mos_plif" if m.group(1) else "mos"), {"num_components": int(m.group(2))}
    if name == "mixtape-noshare":
        return "mixtape", {"frequent_fraction": 1.0}
    if name == "mixtape-unscaled":
        return "mixtape", {"scaled_input": False}
    if name in hf_heads.available_heads():
        return name, {}
    return None


def resolve(names: Sequence[str], table_options: Mapping[str, Dict[str, Any]], option: str = "--heads") -> list:
    """The :class:`Variant` of each name, with ``table_options[head]`` under the variant's options.

    A bad name stops with the choices: the registry's heads and the variant patterns."""
    variants = []
    for name in names:
        parsed = _parse(name)
        if parsed is None:
            raise SystemExit(f"{option}: {name!r} is not a head; choose from the registry "
                             f"({', '.join(hf_heads.available_heads())}) or a variant: mos-K, mos_plif-K "
                             f"(K components, e.g. mos-9), mixtape-noshare, mixtape-unscaled")
        head, extra = parsed
        options = {**table_options.get(head, {}), **extra}
        hf_heads.heads.get_head_class(head).config_class(hidden_size=8, vocab_size=16, **options)  # checks options
        variants.append(Variant(name, head, options))
    return variants
