"""A results page's hand-written reading: what a person wrote on what the numbers mean, kept beside the page
(``docs/reproduction/TABLE-reading.md``, ``studies/bottleneck_map/reading.md``) and pasted into it as written (its lines
of at most 120 columns, its paragraphs separated by a blank line) when the page is generated. Its first line
``<!-- cells: N -->`` says how many cells had finished when it was written; the page says so when the count has moved
since, as the numbers the reading discusses may have too. :func:`unmatched_numbers` checks its numbers against the
json the page is made from."""

from __future__ import annotations

import math
import os
import re
import textwrap
from typing import Callable, Iterable, List, Sequence, Tuple

#: the first line of a reading: how many cells it was written for
READING_CELLS = re.compile(r"<!--\s*cells:\s*(\d+)\s*-->")


#: how a markdown line starts a list item, a heading, a quote or a heading's underline
BLOCK_START = re.compile(r"([-+*=>]|#+|\d+[.)])(\s|$)")


def wrap(text: str) -> str:
    """A json string of prose (a table's notes, a plan's note) in lines of at most 120 columns, none of which starts
    a list, a heading or a quote (its first word then moves to the line before's last)."""
    lines: List[str] = []
    for line in textwrap.wrap(text, 120, break_long_words=False, break_on_hyphens=False):
        if lines and BLOCK_START.match(line):
            head, _, last = lines.pop().rpartition(" ")
            lines += [head] if head else []
            line = f"{last} {line}"
        lines.append(line)
    return "\n".join(lines)


def markdown_table(header: str, rows: Iterable[Sequence]) -> List[str]:
    """A markdown table's lines: its ``header`` line, the separator, a line per row (a row's cells), a blank line."""
    return [header, "|" + "---|" * (header.count("|") - 1), *("| " + " | ".join(map(str, r)) + " |" for r in rows), ""]


def written_reading(path: str, cells: int) -> str:
    """The reading at ``path`` ("" without the file), its paragraphs (separated by a blank line) as written, after a
    note when it was written for another number of finished cells than ``cells``."""
    if not os.path.isfile(path):
        return ""
    with open(path) as f:
        text = f.read().strip()
    m = READING_CELLS.match(text)
    paragraphs = re.split(r"\n\s*\n", text[m.end() :] if m else text)
    body = "\n\n".join("\n".join(line.rstrip() for line in p.strip().splitlines()) for p in paragraphs if p.strip())
    if m and int(m.group(1)) != cells:  # first, where a reader starts
        body = (
            f"*(Written when {m.group(1)} cells had finished; {cells} have now: the numbers below may have moved "
            f"since.)*\n\n{body}"
        )
    return body


#: units after which an integer is a measured number the check reads too ("15 min", "3x"); a decimal is read always
UNITS = (
    "%",
    "x",
    "×",
    "ms",
    "s",
    "min",
    "h",
    "hours",
    "CPU-hours",
    "CPU-hour",
    "nats",
    "nat",
    "bits",
    "GiB",
    "MiB",
    "GB",
    "MB",
    "kB",
)
_UNIT = "|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True))
#: a number in prose: an optional sign, digits (thousands with commas), decimals or an exponent, an optional unit;
#: not part of a word, a version (2.31.10), a path or an option value
NUMBER = re.compile(
    r"(?<![\w.\-/])(?P<sign>[+\-−])?(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:e[+\-]?\d+)?)"
    rf"(?P<unit>\s?(?:{_UNIT})(?![\w]))?(?![\w.]\d|[\w])"
)
_CODE = re.compile(r"`[^`]*`")


def checked_numbers(text: str) -> List[Tuple[str, str]]:
    """The numbers of ``text`` that :func:`unmatched_numbers` checks, as ``(signed number, unit)``: every decimal,
    exponent or percentage, and every integer with a unit of :data:`UNITS`; not inside `code` (commands, options)."""
    out = []
    for m in NUMBER.finditer(_CODE.sub(" ", text)):
        num, unit = m.group("num"), (m.group("unit") or "").strip()
        if "." in num or "e" in num or unit:
            out.append(((m.group("sign") or "").replace("−", "-") + num, unit))
    return out


def number_values(obj) -> List[float]:
    """Every number in a json value (nested dicts and lists; not booleans)."""
    if isinstance(obj, bool):
        return []
    if isinstance(obj, (int, float)):
        return [float(obj)] if math.isfinite(obj) else []
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [v for x in obj for v in number_values(x)]
    return []


def unmatched_numbers(
    text: str, values: Iterable[float], formats: Sequence[Callable[[float], str]], exceptions: Iterable[str] = ()
) -> List[str]:
    """The numbers of a reading (:func:`checked_numbers`) that are no json value formatted by the page's
    ``formats`` (callables, e.g. ``"{:.4f}".format``) and not in ``exceptions`` (written as in the text, with
    their unit). An unsigned number may be a value's magnitude ("0.0201 nats below"), a signed one has the value's
    sign; a percentage may be a fraction's hundredfold. Empty when the reading says only what the json holds."""
    values = list(values)
    shown = {}  # formatted magnitude -> the signs it has among the values
    for v in values:
        for scaled in (v, 100 * v):
            for fmt in formats:
                text_v = fmt(abs(scaled)).lstrip("+")
                shown.setdefault(text_v, set()).add("-" if scaled < 0 else "+")
    exceptions = set(exceptions)
    missing = []
    for number, unit in checked_numbers(text):
        written = number + (unit if unit in ("%", "x", "×") else (" " + unit if unit else ""))
        if written in exceptions or number + unit in exceptions:
            continue
        sign, magnitude = (number[0], number[1:]) if number[0] in "+-" else ("", number)
        signs = shown.get(magnitude.replace(",", "")) or shown.get(magnitude)
        if not signs or (sign and sign not in signs and not (sign == "+" and magnitude.strip("0.") == "")):
            missing.append(written)
    return missing


def rounded(x):
    """``x`` (a page's derived numbers) with every float at 10 significant digits (what the page shows is far
    coarser: the same on every machine, whatever its last bits), a non-finite one None, and every key a string, as
    json reads it back."""
    if isinstance(x, dict):
        return {str(k): rounded(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [rounded(v) for v in x]
    return (float(f"{x:.10g}") if math.isfinite(x) else None) if isinstance(x, float) else x
