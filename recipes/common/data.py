"""Where the recipes read the shared data: one root, ``--data`` where a command takes the root, with one default,
:func:`default_root` (``$SOFTMAX_HEADS_DATA``, else the ``shared/data`` folder beside the checkout, written relative to
the working folder: ``../shared/data`` from the checkout's root, as the docs' commands run). A command that reads one
corpus takes its folder under that root by default (:func:`corpus`). The committed results a page is made from are
under :data:`RECORDS` (:func:`records`), apart from the pages in docs/."""

from __future__ import annotations

import os

#: the environment variable that moves the data root for every command
ENV = "SOFTMAX_HEADS_DATA"
#: the checkout's root (recipes/common/data.py is two folders down)
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


#: the committed raw results each page of docs/ is made from, a folder per page (cells, hypotheses, logs, the derived
#: numbers a reading cites), relative to the checkout's root as the docs' commands run
RECORDS = "records"


def records(page: str) -> str:
    """The folder of ``page``'s committed results (``records/bottleneck_map``), relative to the checkout's root."""
    return os.path.join(RECORDS, page)


def default_root() -> str:
    """``$SOFTMAX_HEADS_DATA``, else ``shared/data`` beside the checkout, relative to the working folder."""
    given = os.environ.get(ENV)
    if given:
        return given
    beside = os.path.join(os.path.dirname(CHECKOUT), "shared", "data")
    try:
        return os.path.relpath(beside)
    except ValueError:  # another drive (Windows)
        return beside


def corpus(name: str, root: str = "") -> str:
    """The folder of the corpus ``name`` (``ptb``, ``wikitext-2``, ``multi30k``) under ``root`` (default:
    :func:`default_root`)."""
    return os.path.join(root or default_root(), name)


def add_data_option(parser, help: str = "the shared data folder (ptb/, wikitext-2/, multi30k/, ...)") -> None:
    """``--data ROOT``, default :func:`default_root`; the help says how to move it."""
    parser.add_argument("--data", default=default_root(), help=f"{help}; default: ${ENV}, else ../shared/data")
