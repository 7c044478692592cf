"""A results page's hand-written reading: the paragraph a person wrote on what the numbers mean, kept beside the page
(``docs/reproduction/TABLE-reading.md``, ``docs/bottleneck_map-reading.md``) and pasted into it when the page is
generated. Its first line ``<!-- cells: N -->`` says how many cells had finished when it was written; the page says so
when the count has moved since, as the numbers the reading discusses may have too."""

from __future__ import annotations

import os
import re

#: the first line of a reading: how many cells it was written for
READING_CELLS = re.compile(r"<!--\s*cells:\s*(\d+)\s*-->")


def written_reading(path: str, cells: int) -> str:
    """The reading at ``path`` as one paragraph ("" without the file), followed by a note when it was written for
    another number of finished cells than ``cells``."""
    if not os.path.isfile(path):
        return ""
    with open(path) as f:
        text = f.read().strip()
    m = READING_CELLS.match(text)
    body = " ".join(text[m.end() :].split()) if m else " ".join(text.split())
    if m and int(m.group(1)) != cells:
        body += (
            f" *(Written when {m.group(1)} cells had finished; {cells} have now: the numbers above may have "
            f"moved since.)*"
        )
    return body
