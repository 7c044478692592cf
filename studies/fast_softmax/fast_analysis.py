"""The fast-softmax study's analysis apart from its page (:mod:`studies.fast_softmax.fast_report`): the runs' json
collected into ``studies/fast_softmax/records/`` (their plots into its ``figures/``), read back, and the derived
numbers (:func:`derived`) the page's tables and its reading cite."""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

from studies.fast_softmax.ds_softmax import PAPER as POSTER
from studies.fast_softmax.ds_softmax import from_json
from recipes.common.runtime import cpu_seconds
from recipes.common.stats import format_p, holm, wilson


#: the poster's SVD-10 column (top-1 accuracy full -> SVD, FLOPs reduction, ms full -> SVD, on a GPU)
POSTER_SVD = {
    "PTB": {"full": 0.252, "svd": 0.251, "flops": 5.00, "ms": (0.73, 0.18)},
    "Wiki-2": {"full": 0.257, "svd": 0.255, "flops": 5.38, "ms": (3.07, 0.60)},
}


#: the adaptive-sampling paper's figure as the spec quotes it (../shared/SPEC.md; the paper's summary in
#: ../shared/papers prints no table value): up to 30x fewer multiplications on Mistral-7B over WikiText, at its success
#: criterion with epsilon = 0.3 (V = 32,000 and d = 4,096 are Mistral-7B's configuration; neither source ties the
#: figure to one of the paper's deltas, 0.1, 0.05 and 0.01)
ADAPTIVE_PAPER = {"setting": "paper: Mistral-7B, WikiText", "V": 32000, "d": 4096, "delta": "-", "gain": 30.0}

PLOTS = ("svd-spectra.png", "svd-ppl-vs-window.png")


WITHIN = 0.01  # the smallest preview window keeps the perplexity within this (relative) of the exact softmax's


def collect(
    svd: Optional[str], ds: Sequence[str], out_dir: str, note: Optional[str], figures: str = "", decoding=()
) -> None:
    """Copy the SVD study's ``results.json`` into ``out_dir`` as ``svd_study.json`` (``{"notes": [...], "results":
    [...]}``), its plots into ``figures`` (default ``out_dir``); merge the rows of each DS-Softmax run in ``ds`` into
    ``ds.json`` by task, and each decoding run in ``decoding`` (``python -m studies.fast_softmax.decoding``'s
    folders) into ``decoding.json`` by model, a row per head (``{"notes": {task | model: [...]}, "results": [...]}``):
    a task or model collected again replaces its own rows and notes, the others stay."""
    figures = figures or out_dir
    for folder in (out_dir, figures):
        os.makedirs(folder, exist_ok=True)
    if svd:
        with open(os.path.join(out_dir, "svd_study.json"), "w") as out:
            json.dump({"notes": [note] if note else [], "results": _results(svd, "--svd")}, out, indent=1)
        for plot in PLOTS:
            shutil.copyfile(os.path.join(svd, plot), os.path.join(figures, plot))
    if ds:
        _merge(out_dir, "ds", "task", [r for run in ds for r in _results(run, "--ds")], note)
    runs = [_results(run, "--decoding") for run in decoding]
    if runs:
        rows = [
            {"model": r["settings"]["model"], "name": n, "settings": r["settings"], **h}
            for r in runs
            for n, h in r["heads"].items()
        ]
        _merge(out_dir, "decoding", "model", rows, note)


def _merge(out_dir: str, name: str, key: str, new: List[Dict], note: Optional[str]) -> None:
    """``new`` rows into ``out_dir/name.json``, replacing the rows and notes of the ``key`` values they have."""
    merged = load(out_dir, name) or {"notes": {}, "results": []}
    keys = list(dict.fromkeys(r[key] for r in new))
    merged["results"] = [r for r in merged["results"] if r[key] not in keys] + new
    merged["notes"] = {
        **{k: n for k, n in merged["notes"].items() if k not in keys},
        **{k: [note] if note else [] for k in keys},
    }
    with open(os.path.join(out_dir, f"{name}.json"), "w") as out:
        json.dump(merged, out, indent=1)


def _results(run: str, option: str):
    path = os.path.join(run, "results.json")
    if not os.path.isfile(path):
        raise SystemExit(f"{option} {run}: no results.json there (run its command first)")
    with open(path) as f:
        return json.load(f)


def load(out_dir: str, name: str) -> Optional[Dict]:
    path = os.path.join(out_dir, f"{name}.json")
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)


def method_rows(result: Dict, method: str = "svd_softmax") -> List[Dict]:
    return [r for r in result["rows"] if r["method"] == method]


def svd_rows(result: Dict, d: Dict) -> Tuple[List[Dict], List[Tuple[str, Dict]]]:
    """A setting's SVD tables' rows: per (N, W) with both previews the adaptive row with its leading one (``lead``),
    and the timed methods by name (the exact softmax, SVD-softmax at ``d``'s N, the class-based heads)."""
    by = {(r["N"], r["W"], r["preview"]): r for r in method_rows(result)}
    adaptive = [r for k, r in sorted(by.items()) if k[2] == "adaptive" and (*k[:2], "leading") in by]
    timed = [r for r in method_rows(result) if r["N"] == d["N"] and "ms_per_token" in r]
    named = [(r["method"], r) for r in result["rows"][:1]]
    named += [(f"svd_softmax {r['preview']} W={r['W']} N={r['N']}", r) for r in timed]
    named += [(f"{r['method']} ({r['classes']} classes)", r) for r in result["rows"] if "classes" in r]
    return [{**r, "lead": by[r["N"], r["W"], "leading"]} for r in adaptive], named


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


#: the poster's corpus of a DS task
POSTER_OF = {"ptb": "PTB", "wikitext-2": "Wiki-2"}


def _ds(rows: List[Dict]) -> List[Dict]:
    """Per DS-Softmax row: its batch-1 speed-up as a share of its FLOPs reduction, its top-1 against the LM's softmax
    and (where the run had it) against the softmax given the same extra training, with McNemar's p of both, Holm-
    adjusted over every distinct test of the page; and whether its FLOPs reduction is the nearest its task has to the
    poster's (by ratio)."""
    # the family: each DS row against its control, and each task's control against its LM once (every E shares it)
    tests = {(i, "ds_vs_control"): r["mcnemar_ds_vs_control"]["p"] for i, r in enumerate(rows) if "top1_control" in r}
    tests.update({(r["task"], "control_vs_lm"): r["mcnemar_control_vs_lm"]["p"] for r in rows if "top1_control" in r})
    adjusted = dict(zip(tests, holm(list(tests.values()))))
    out = []
    for i, r in enumerate(rows):
        d = {
            "task": r["task"],
            "experts": r["experts"],
            "wall_per_flops": r["speedup"][1] / r["flops_reduction"],
            "top1": r["top1_ds"] - r["top1_softmax"],
        }
        if "top1_control" in r:
            d.update(
                top1_vs_control=r["top1_ds"] - r["top1_control"],
                p_vs_control=adjusted[i, "ds_vs_control"],
                control_vs_lm=r["top1_control"] - r["top1_softmax"],
                p_control_vs_lm=adjusted[r["task"], "control_vs_lm"],
            )
        if r["task"] in POSTER_OF:
            gap = abs(math.log(r["flops_reduction"] / POSTER[POSTER_OF[r["task"]]]["flops"]))
            others = [
                abs(math.log(o["flops_reduction"] / POSTER[POSTER_OF[r["task"]]]["flops"]))
                for o in rows
                if o["task"] == r["task"]
            ]
            d["nearest_poster"] = gap == min(others)
        out.append(d)
    return out


def ds_rows(ds: Dict, nums: Dict) -> Tuple[List[Dict], List[Dict], List[Dict]]:
    """The DS tables' rows: the runs' rows, each with its derived numbers (``points``: top-1 differences in points;
    ``nearest``: the poster's FLOPs reduction where the row is its task's nearest to it), and those with a control
    (``p1``, ``p2``: the adjusted p of DS against the control and of the control against the LM, as printed)."""
    rows = [from_json(r) for r in ds["results"]]
    cmp, control = [], []
    for r, d in zip(rows, nums["ds"]):
        near = POSTER[POSTER_OF[r["task"]]]["flops"] if d.get("nearest_poster") else None
        speed = {"s1": r["speedup"][1], "s64": r["speedup"][64], "points": 100 * d["top1"]}
        cmp.append({**r, **d, **speed, "nearest": f"yes ({near:.2f}x)" if near else ""})
        if "top1_control" in r:
            p = {"p1": format_p(d["p_vs_control"]), "p2": format_p(d["p_control_vs_lm"])}
            control.append(
                {**r, **p, "points_control": 100 * d["top1_vs_control"], "points_lm": 100 * d["control_vs_lm"]}
            )
    return rows, cmp, control


def _modes(row: Dict) -> Dict[str, str]:
    """A decoding row's modes as its speed json names them, by the names of the page's fields."""
    return {"greedy": "greedy", "top_k": f"top-{row['top_k']}"}


def _decoding(rows: List[Dict]) -> List[Dict]:
    """Per decoding row (a model's head): its agreement with the full softmax (the median identical greedy prefix,
    the share of prompts identical over all new tokens) and per thread count the fast path's decode speed-up of
    greedy and top-k sampling, the head's share of a full-softmax decoding step, the speed-up Amdahl's law allows
    a head that took no time at all, ``1 / (1 - share)``, and the milliseconds of that step (greedy) and of the
    head's full forward in it."""
    out = []
    for r in rows:
        prefix, speed = r["greedy_prefix"], {}
        for threads, s in r["speed"].items():
            rate = {
                m: s[name]["fast"]["decode_tokens_per_s"] / s[name]["full"]["decode_tokens_per_s"]
                for m, name in _modes(r).items()
            }
            share = s["head_share_of_decode"]
            bound = 1 / (1 - share) if share < 1 else math.inf
            step_ms = 1000 / s["greedy"]["full"]["decode_tokens_per_s"]
            speed[threads] = {
                **{f"{m}_speedup": x for m, x in rate.items()},
                "head_share": share,
                "bound": bound,
                "step_ms": step_ms,
                "head_ms": share * step_ms,
            }
        whole = sum(p == r["settings"]["new_tokens"] for p in prefix) / len(prefix)
        out.append({"prefix_median": statistics.median(prefix), "prefix_whole": whole, "speed": speed})
    return out


def decoding_rows(dec: Dict, nums: Dict) -> Tuple[List[Dict], List[Dict]]:
    """The decoding tables' rows: agreement per head, and speed per head and thread count (``greedy_full`` /
    ``_fast``, ``top_k_full`` / ``_fast``: decode-only tokens per second), each with its derived numbers."""
    agree, speed = [], []
    for r, d in zip(dec["results"], nums["decoding"]):
        agree.append({**r, **d, "new_tokens": r["settings"]["new_tokens"]})
        for threads, s in r["speed"].items():
            rates = {f"{m}_{p}": s[name][p]["decode_tokens_per_s"] for m, name in _modes(r).items() for p in s[name]}
            speed.append({**r, **s, **rates, **d["speed"][threads], "threads": threads})
    return agree, speed


def _adaptive(results: List[Dict]) -> List[Dict]:
    """Per setting with the adaptive-sampling part (:func:`studies.fast_softmax.svd_study.adaptive_study`) and per
    delta, for the bound as written and the calibrated variance scale: the success rate's 95% Wilson interval over the
    test states."""
    out = []
    for r in results:
        part = r.get("adaptive")
        for row in part["rows"] if part else []:
            ci = {m: wilson(row[m]["success"] * part["queries"], part["queries"]) for m in ("bound", "calibrated")}
            out.append({"setting": r["setting"], "delta": row["delta"], **{f"{m}_ci": list(v) for m, v in ci.items()}})
    return out


#: CPU-hours that no kept run's json holds (runs cut short or discarded, steps not timed then), estimated from the
#: sessions' notes: ``studies/fast_softmax/records/cpu_unrecorded.json``, ``{"rows": [{"part", "hours"}, ...]}``
UNRECORDED = "cpu_unrecorded"


def _cpu(ds: Optional[Dict], svd: Optional[Dict], decoding: Optional[Dict], unrecorded: Optional[Dict]) -> Dict:
    """The study's CPU-core-hours, a row per command and part: what the kept runs recorded (:func:`recipes.common.
    runtime.cpu_seconds`; the WikiText-2 LSTM's training once, each SVD setting and its adaptive-sampling part, each DS
    task's control once and DS row: its whole run where recorded, else its training seconds x threads, its states,
    scoring and timing then uncounted; each decoding head), then the estimates of :data:`UNRECORDED`; and the total
    (also the last row's)."""
    rows, lstm = [], None
    for r in (svd or {}).get("results", []):
        rows.append({"command": "svd_study", "part": r["setting"], "hours": cpu_seconds(r) / 3600})
        if "adaptive" in r:
            part = f"{r['setting']} adaptive sampling"
            rows.append({"command": "svd_study", "part": part, "hours": cpu_seconds(r["adaptive"]) / 3600})
    controls = {}
    for r in (ds or {}).get("results", []):
        lstm = lstm or ((r["info"].get("lm") or {}).get("cpu_seconds") if r["task"] == "wikitext-2" else None)
        threads = r.get("threads") or 1
        if "control" in r["runs"]:
            controls.setdefault(r["task"], r["runs"]["control"]["train_seconds"] * threads)
        row_cpu = r.get("cpu_seconds", r["ds_train_seconds"] * threads)
        rows.append({"command": "ds_softmax", "part": f"{r['task']} E={r['experts']}", "hours": row_cpu / 3600})
    rows += [{"command": "ds_softmax", "part": f"{t} control", "hours": s / 3600} for t, s in controls.items()]
    for r in (decoding or {}).get("results", []):
        rows.append({"command": "decoding", "part": f"{r['model']} {r['name']}", "hours": cpu_seconds(r) / 3600})
    if lstm:
        rows.insert(0, {"command": "lms", "part": "wikitext-2 LSTM", "hours": lstm / 3600})
    rows = [{**r, "source": "recorded"} for r in rows]
    rows += [{"command": "-", **r, "source": "estimated"} for r in (unrecorded or {}).get("rows", [])]
    total = sum(r["hours"] for r in rows)
    return {"rows": rows + [{"command": "all", "part": "", "hours": total, "source": ""}], "total_hours": total}


def derived(
    ds: Optional[Dict], svd: Optional[Dict], decoding: Optional[Dict] = None, unrecorded: Optional[Dict] = None
) -> Dict:
    """The numbers the tables and the reading cite that no run's json holds (``numbers.json``); ``unrecorded``: the
    CPU-hours no run recorded (:data:`UNRECORDED`)."""
    return {
        "within": WITHIN,
        "sources": [_source(f"DS-64 {k}", p, "ds") for k, p in POSTER.items()]
        + [_source(f"SVD-10 {k}", p, "svd") for k, p in POSTER_SVD.items()],
        "ds": _ds([from_json(r) for r in ds["results"]]) if ds else [],
        "svd": [_setting(r) for r in (svd["results"] if svd else [])],
        "decoding": _decoding(decoding["results"]) if decoding else [],
        "adaptive": _adaptive(svd["results"] if svd else []),
        "cpu": _cpu(ds, svd, decoding, unrecorded),
    }
