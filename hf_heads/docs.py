"""The README's table of heads, generated from the registry (``python -m hf_heads.docs``)."""
from __future__ import annotations

import dataclasses

from .heads import HeadConfig, available_heads, get_head_class

_SHARED = {f.name for f in dataclasses.fields(HeadConfig)}


def heads_table() -> str:
    """Markdown table: head name, paper, its own options with defaults (shared options omitted)."""
    rows = ["| head | paper | options (default) |", "|---|---|---|"]
    for name in available_heads():
        cls = get_head_class(name)
        own = [f for f in dataclasses.fields(cls.config_class) if f.name not in _SHARED]
        opts = ", ".join(f"`{f.name}` ({f.default})" for f in own) or "-"
        rows.append(f"| `{name}` | {cls.paper} | {opts} |")
    shared = ", ".join(f"`{f.name}`" for f in dataclasses.fields(HeadConfig))
    rows.append("")
    rows.append(f"Every head also takes {shared}, and `weight` / `bias` tensors to start from an "
                f"existing projection.")
    return "\n".join(rows)


if __name__ == "__main__":
    print(heads_table())
