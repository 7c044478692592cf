"""The fast-softmax study's analysis apart from its page (:mod:`recipes.fast_report`): the runs' json collected into
``records/fast_softmax_study/`` (their plots into ``docs/fast_study/``), read back, and the derived numbers
(:func:`derived`) the page's tables and its reading cite."""

from __future__ import annotations

import json
import os
import shutil
from typing import Dict, List, Optional

from recipes.ds_softmax import PAPER as POSTER
from recipes.ds_softmax import from_json


#: the poster's SVD-10 column (top-1 accuracy full -> SVD, FLOPs reduction, ms full -> SVD, on a GPU)
POSTER_SVD = {
    "PTB": {"full": 0.252, "svd": 0.251, "flops": 5.00, "ms": (0.73, 0.18)},
    "Wiki-2": {"full": 0.257, "svd": 0.255, "flops": 5.38, "ms": (3.07, 0.60)},
}


PLOTS = ("svd-spectra.png", "svd-ppl-vs-window.png")


WITHIN = 0.01  # the smallest preview window keeps the perplexity within this (relative) of the exact softmax's


def collect(svd: Optional[str], ds: Optional[str], out_dir: str, note: Optional[str], figures: str = "") -> None:
    """Copy the runs' ``results.json`` into ``out_dir`` as ``svd_study.json`` / ``ds_wt2.json``, each as
    ``{"notes": [...], "results": [...]}``, and the SVD study's plots into ``figures`` (default ``out_dir``)."""
    figures = figures or out_dir
    for folder in (out_dir, figures):
        os.makedirs(folder, exist_ok=True)
    for run, name in [(r, n) for r, n in ((svd, "svd_study"), (ds, "ds_wt2")) if r]:
        path = os.path.join(run, "results.json")
        if not os.path.isfile(path):
            raise SystemExit(f"--{name.split('_')[0]} {run}: no results.json there (run its command first)")
        with open(path) as f, open(os.path.join(out_dir, f"{name}.json"), "w") as out:
            json.dump({"notes": [note] if note else [], "results": json.load(f)}, out, indent=1)
        for plot in PLOTS if name == "svd_study" else ():
            shutil.copyfile(os.path.join(run, plot), os.path.join(figures, plot))


def load(out_dir: str, name: str) -> Optional[Dict]:
    path = os.path.join(out_dir, f"{name}.json")
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)


def method_rows(result: Dict, method: str = "svd_softmax") -> List[Dict]:
    return [r for r in result["rows"] if r["method"] == method]


def _setting(result: Dict) -> Dict:
    """At the largest N: the smallest W within :data:`WITHIN` of the exact perplexity per preview, the excess of the
    largest W's perplexity over the exact one, and the hierarchical softmax's."""
    ppl, svd, hier = result["rows"][0]["ppl"], method_rows(result), method_rows(result, "class_softmax")
    n, w = max(r["N"] for r in svd), max(r["W"] for r in svd)
    ok = sorted((r["W"], r["preview"]) for r in svd if r["N"] == n and r["ppl"] <= ppl * (1 + WITHIN))
    return {
        "setting": result["setting"],
        "N": n,
        "smallest_window": {p: next((x for x, q in ok if q == p), None) for p in ("adaptive", "leading")},
        "largest_window_excess": {r["preview"]: r["ppl"] / ppl - 1 for r in svd if (r["N"], r["W"]) == (n, w)},
        "hierarchical_excess": hier[0]["ppl"] / ppl - 1 if hier else None,
    }


def _source(name: str, p: Dict, fast: str) -> Dict:
    """A source's row: its top-1 difference, wall-clock speed-up and the speed-up's share of its FLOPs reduction."""
    wall, top1 = p["ms"][0] / p["ms"][1], p[fast] - p["full"]
    extra = {"name": name, "fast": p[fast], "top1": top1, "wall_clock": wall, "wall_per_flops": wall / p["flops"]}
    return {**p, "ms": list(p["ms"]), **extra}


def _ds(r: Dict) -> Dict:
    """A DS-Softmax row's batch-1 speed-up as a share of its FLOPs reduction, and its top-1 gain."""
    top1 = r["top1_ds"] - r["top1_softmax"]
    return {"experts": r["experts"], "wall_per_flops": r["speedup"][1] / r["flops_reduction"], "top1": top1}


def derived(ds: Optional[Dict], svd: Optional[Dict]) -> Dict:
    """The numbers the tables and the reading cite that no run's json holds (``numbers.json``)."""
    return {
        "within": WITHIN,
        "sources": [_source("DS-64 Wiki-2", POSTER["Wiki-2"], "ds")]
        + [_source(f"SVD-10 {k}", p, "svd") for k, p in POSTER_SVD.items()],
        "ds": [_ds(from_json(r)) for r in (ds["results"] if ds else [])],
        "svd": [_setting(r) for r in (svd["results"] if svd else [])],
    }
