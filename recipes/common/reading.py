"""A results page's hand-written reading: what a person wrote on what the numbers mean, kept beside the page
(``docs/reproduction/TABLE-reading.md``, ``docs/bottleneck_map-reading.md``) and pasted into it when the page is
generated, one line per paragraph (paragraphs are separated by a blank line). Its first line ``<!-- cells: N -->``
says how many cells had finished when it was written; the page says so when the count has moved since, as the numbers
the reading discusses may have too."""

from __future__ import annotations

import os
import re

#: the first line of a reading: how many cells it was written for
READING_CELLS = re.compile(r"<!--\s*cells:\s*(\d+)\s*-->")


def written_reading(path: str, cells: int) -> str:
    """The reading at ``path`` ("" without the file), each of its paragraphs (separated by a blank line) joined into
    one line, after a note when it was written for another number of finished cells than ``cells``."""
    if not os.path.isfile(path):
        return ""
    with open(path) as f:
        text = f.read().strip()
    m = READING_CELLS.match(text)
    paragraphs = re.split(r"\n\s*\n", text[m.end() :] if m else text)
    body = "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())
    if m and int(m.group(1)) != cells:  # first, where a reader starts
        body = (
            f"*(Written when {m.group(1)} cells had finished; {cells} have now: the numbers below may have moved "
            f"since.)*\n\n{body}"
        )
    return body
