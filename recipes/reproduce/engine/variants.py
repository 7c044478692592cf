"""Head variants of the reproduced tables: a registry head with the options a table gives it.

A table names its heads as the papers do: the registry's names (``softmax``, ``mixtape``, ``plif``, ...) plus
variants such as ``mos-9`` (MoS with K = 9 components), ``mixtape-noshare`` (Mixtape without gate sharing:
every token has its own gate priors, r = 1) and ``mixtape-unscaled`` (Mixtape with ``scaled_input=False``: its
projections in torch's ``nn.Linear`` form, the library's default since head spec version 2; the mini tables'
``mixtape`` rows state Mesh TensorFlow's form, ``scaled_input=True``, in their head options; see ``MixtapeConfig``),
and ``softmax-matched`` (softmax on a larger model: the table gives the row its sizes, matched to another row's
parameter count).
The table's own options for a head (its dropouts, the paper's r) come first; a variant's options are applied on top.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Sequence

import hf_heads


#: the two forms of Mixtape's projections as the mini tables name them (in their report notes)
MIXTAPE_FORMS = (
    "`mixtape` is Mesh TensorFlow's form of Mixtape's projections (`scaled_input=True`: g scaled by "
    "d1^-1/2, unit-variance weights, made for Adafactor; the library's default before head spec "
    "version 2); `mixtape-unscaled` torch's `nn.Linear` form, the library's default since (the same "
    "function at initialisation, but Adam moves its projections about sqrt(d1) times faster, SGD d1 "
    "times)."
)


def mixtape_forms(rows: Sequence[str]) -> str:
    """The note on Mixtape's forms for a table with these ``rows``: both forms (:data:`MIXTAPE_FORMS`), the default
    form alone, or "" without a Mixtape row."""
    if "mixtape" in rows:
        return MIXTAPE_FORMS
    if "mixtape-unscaled" in rows:
        return (
            "`mixtape-unscaled` is torch's `nn.Linear` form of Mixtape's projections, the library's default since "
            "head spec version 2 (Mesh TensorFlow's form, `scaled_input=True`, has no row here)."
        )
    return ""


def full_mixtape_form(optimizer: str, slower: str) -> str:
    """Why a full-size plan runs Mixtape in torch's nn.Linear form (in the note of every plan with a Mixtape row):
    under ``optimizer`` Mesh TensorFlow's form moves its projections about ``slower`` times more slowly."""
    return (
        f"Mixtape runs with its projections in torch's nn.Linear form (scaled_input=false, the library's "
        f"default): under {optimizer} Mesh TensorFlow's form, made for Adafactor, moves its projections about "
        f"{slower} times more slowly relative to the function."
    )


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
    if name == "softmax-matched":
        return "softmax", {}
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
            raise SystemExit(
                f"{option}: {name!r} is not a head; choose from the registry "
                f"({', '.join(hf_heads.available_heads())}) or a variant: mos-K, mos_plif-K "
                f"(K components, e.g. mos-9), mixtape-noshare, mixtape-unscaled, softmax-matched"
            )
        head, extra = parsed
        options = {**table_options.get(head, {}), **extra}
        hf_heads.check_head_options(head, hidden_size=8, vocab_size=16, **options)  # the model's sizes come later
        variants.append(Variant(name, head, options))
    return variants
