"""The docs' tables generated from the registry: the README's table of heads (``python -m hf_heads.docs``) and
docs/heads.md's table of starts (``python -m hf_heads.docs starts``)."""

from __future__ import annotations

import dataclasses

import sys

from .core import HeadConfig, available_heads, get_head_class, head_specific_options, heads_where, start_table


def heads_table() -> str:
    """Markdown table: head name, paper, its own options with defaults (shared options omitted)."""
    rows = ["| head | paper | options (default) |", "|---|---|---|"]
    for name in available_heads():
        opts = (
            ", ".join(f"`{f.name}` ({f.metadata.get('shown', f.default)})" for f in head_specific_options(name)) or "-"
        )
        rows.append(f"| `{name}` | {get_head_class(name).paper} | {opts} |")
    fields = [f.name for f in dataclasses.fields(HeadConfig)]
    mapped = [n for n in fields if n.startswith("logit_")]
    shared = ", ".join(f"`{n}`" for n in fields if n not in mapped)
    rows.append("")
    rows.append(
        f"Every head also takes {shared}, and `weight` / `bias` tensors to start from an existing projection; "
        f"{', '.join(f'`{h}`' for h in heads_where(applies_logit_map=True))} also take "
        f"{' and '.join(f'`{n}`' for n in mapped)}, a fixed scale / soft-cap of the logits before their softmaxes "
        f"(what `swap_head` moves from a model that scales or soft-caps its logits)."
    )
    return "\n".join(rows)


def starts_table() -> str:
    """Markdown table: for every head, whether ``start="pretrained"`` starts it exactly at the model it replaces,
    and what that start sets or how far the nearest one is (:func:`hf_heads.core.start.start_table`)."""
    rows = ['| head | `start="pretrained"` | what it sets, or how far `start="nearest"` is |', "|---|---|---|"]
    for name, exact, what in start_table():
        rows.append(f"| `{name}` | {'exact' if exact else 'refused'} | {what.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(starts_table() if sys.argv[1:] == ["starts"] else heads_table())
