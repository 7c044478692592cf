"""The README's table of heads, generated from the registry (``python -m hf_heads.docs``)."""

from __future__ import annotations

import dataclasses

from .core import HeadConfig, available_heads, get_head_class, head_specific_options


def heads_table() -> str:
    """Markdown table: head name, paper, its own options with defaults (shared options omitted)."""
    rows = ["| head | paper | options (default) |", "|---|---|---|"]
    for name in available_heads():
        opts = (
            ", ".join(f"`{f.name}` ({f.metadata.get('shown', f.default)})" for f in head_specific_options(name)) or "-"
        )
        rows.append(f"| `{name}` | {get_head_class(name).paper} | {opts} |")
    shared = ", ".join(f"`{f.name}`" for f in dataclasses.fields(HeadConfig))
    rows.append("")
    rows.append(f"Every head also takes {shared}, and `weight` / `bias` tensors to start from an existing projection.")
    return "\n".join(rows)


if __name__ == "__main__":
    print(heads_table())
