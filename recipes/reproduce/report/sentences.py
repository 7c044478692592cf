"""The report's sentences built from the numbers: what the seeds, caps, claims, parameters and timings say, each a
function of the json alone."""

from __future__ import annotations

import statistics
from typing import Any, Dict, List

from recipes.reproduce.report import compare as head_comparison
from recipes.reproduce.engine import results as result_files
from recipes.reproduce.engine import sweep as sweep_rules
from recipes.reproduce.report.layout import SCORES, mean_std, score_rows


def lowercased_line(lowercased: Dict[str, Dict[str, Dict[str, list]]]) -> str:
    """The sentence under a translation table: each head's case-insensitive BLEU per test set (mean ± sample std
    over its seeds), the scoring of the published Multi30k numbers in the table's note; "" without any."""

    parts = []
    for head, by_set in lowercased.items():
        scores = []
        for testset, entry in by_set.items():
            values = entry["values"]
            std = statistics.stdev(values) if len(values) > 1 else None
            scores.append(f"{testset} {mean_std(statistics.fmean(values), std)}")
        parts.append(f"{head} {', '.join(scores)} ({len(next(iter(by_set.values()))['values'])} seeds)")
    if not parts:
        return ""
    return (
        "BLEU lowercased (sacrebleu -lc on the committed hypotheses; published Multi30k systems are scored "
        "case-insensitively): " + "; ".join(parts) + "."
    )


def misrecorded(cells: List[Dict[str, Any]], table: str) -> str:
    """The sentence on cells whose recorded commands name another cell's directory (recorded by an earlier version;
    replaying them would resume or overwrite that cell), or ""."""
    wrong = sorted(
        {
            (c["head"], c["seed"])
            for c in cells
            if c.get("commands")
            and f"/{result_files.cell_dir('', c['head'], c['seed'], c.get('lr'))}/" not in c["commands"][0]
        }
    )
    if not wrong:
        return ""
    cells_text = ", ".join(f"{h} seed {s}" for h, s in wrong)
    return (
        f" The recorded commands of {cells_text} name another cell's directory (an earlier version recorded "
        f"them): rerun such a cell with `python -m recipes.reproduce {table} --heads HEAD` instead of replaying "
        f"its command."
    )


def worst_seeds(rows: List[Dict[str, Any]]) -> str:
    """Which seed scores worst for each head with several seeds, on each validation split (or the first split):
    whether a bad seed is bad for every head, from the numbers."""
    rows = score_rows(rows)
    splits = list(dict.fromkeys(r["split"] for r in rows))
    out = []
    for split in [s for s in splits if "valid" in s] or splits[:1]:
        higher = rows[0]["metric"] != "ppl"
        worst = {
            r["head"]: r["seeds"][r["values"].index((min if higher else max)(r["values"]))]
            for r in rows
            if r["split"] == split and len(r["values"]) > 1 and r.get("seeds")
        }
        if len(worst) < 2:
            continue
        seeds = set(worst.values())
        out.append(
            f"Worst seed on {split}: seed {seeds.pop()} for every head."
            if len(seeds) == 1
            else f"Worst seed on {split}: " + ", ".join(f"{h} {s}" for h, s in worst.items()) + "."
        )
    return " ".join(out)


def claims_for(
    table, comparisons: List["head_comparison.Comparison"], rows: List[Dict[str, Any]]
) -> Dict[tuple, float]:
    """The paper's difference for each test comparison of a head with a claim (``table.paper_claims``: its relative
    difference from softmax in its paper) against softmax or the size-matched softmax: the same relative difference at
    our baseline's mean, so it reads on our scale."""
    claims = getattr(table, "paper_claims", None) or {}
    means = {(r["head"], r["split"]): r["mean"] for r in score_rows(rows)}
    out = {}
    for c in comparisons:
        claim = claims.get(c.head)
        base = means.get((c.baseline, c.split))
        if (
            claim
            and base is not None
            and head_comparison.is_test(c.split)
            and c.baseline in ("softmax", head_comparison.MATCHED)
        ):
            out[(c.head, c.baseline, c.split)] = claim["relative"] * base
    return out


def claim_sources(claims: Dict[tuple, float], table) -> str:
    """Where the paper's-difference column comes from: each claimed head's source and relative difference, or ""."""
    sources = getattr(table, "paper_claims", None) or {}
    heads = list(dict.fromkeys(head for head, _, _ in claims))
    if not heads:
        return ""
    return (
        "The paper's differences come from: "
        + "; ".join(f"{h}: {sources[h]['source']} ({sources[h]['relative']:+.1%})" for h in heads if h in sources)
        + " (each paper against its own softmax; scaled to our baseline's mean)."
    )


def untestable_claims(comparisons: List["head_comparison.Comparison"], claims: Dict[tuple, float], table) -> str:
    """The sentence on the papers' claims smaller than what the table detects (80% power), and on those whose
    comparison has too few of its planned seeds for a test yet; or ""."""
    claimed = [c for c in comparisons if (c.head, c.baseline, c.split) in claims]
    small = [
        c for c in claimed if c.detectable is not None and abs(claims[(c.head, c.baseline, c.split)]) < c.detectable
    ]
    waiting = [c for c in claimed if c.detectable is None and c.planned and head_comparison.is_test(c.split)]
    sources = getattr(table, "paper_claims", {})
    out = []
    if small:
        out.append(
            f"The table cannot test these papers' claims (the claimed difference, at our baseline's "
            f"{head_comparison.metric_unit(getattr(table, 'metric', 'ppl'))}, is "
            "below what its seeds detect with 80% power at Holm's first level): "
            + "; ".join(
                f"{c.head} - {c.baseline} on {c.split}: claimed {claims[(c.head, c.baseline, c.split)]:+.2f} "
                f"({sources[c.head]['source']}), detectable ±{c.detectable:.2f}"
                + (
                    " with " + head_comparison.seeds_of(c) + " seeds so far"
                    if " of " in head_comparison.seeds_of(c)
                    else ""
                )
                for c in small
            )
            + "."
        )
    if waiting:
        out.append(
            "Not yet tested, with one of their planned seeds: "
            + "; ".join(
                f"{c.head} - {c.baseline} on {c.split} (claimed {claims[(c.head, c.baseline, c.split)]:+.2f}, "
                f"1 of {c.planned} seeds)"
                for c in waiting
            )
            + "."
        )
    return " ".join(out)


def bits(x: float) -> str:
    """A small signed number of bits: 3 decimals, or 2 significant digits where those would read +-0.000."""
    return f"{x:+.2g}" if x != 0 and abs(x) < 0.0005 else f"{x:+.3f}"


def cap_sentence(cells: List[Dict[str, Any]]) -> str:
    """Where the epoch cap, not patience, ended most of the rows' cells: how many, and the valid loss's slope over
    their last two epochs (bits per epoch, the median; negative: still falling), or ""."""
    capped = [c for c in cells if c.get("stopped") in ("max_epochs", "max_updates") and len(c.get("curve") or []) >= 3]
    if not cells or 2 * len(capped) <= len(cells):
        return ""
    slopes = sorted((sweep_rules.nll(c["curve"][-1]) - sweep_rules.nll(c["curve"][-3])) / 2 for c in capped)
    cap = max(c["curve"][-1]["epoch"] for c in capped)
    return (
        f"{len(capped)} of the {len(cells)} cells of the rows stopped at the cap ({cap} epochs), not by patience: "
        f"the numbers are at the cap, not converged; their valid NLL still moved {bits(statistics.median(slopes))} "
        f"bits an epoch over the last two epochs (median; from {bits(slopes[0])} to {bits(slopes[-1])}; "
        f"{100 * (2 ** statistics.median(slopes) - 1):+.1f}% perplexity an epoch at the median)."
    )


def parameters_line(cells: List[Dict[str, Any]]) -> str:
    """Each row's parameter count (from its cells' checkpoints), or ""."""
    counts = {c["head"]: c["parameters"] for c in cells if c.get("parameters")}
    if not counts:
        return ""
    mos = next((h for h in counts if h.startswith("mos")), None)
    sized = [h for h in counts if mos and (h.startswith("mixtape") or h == head_comparison.MATCHED)]
    return (
        "Parameters per row: "
        + ", ".join(f"{h} {n / 1e6:.2f}M" for h, n in counts.items())
        + (
            f" (of {mos}'s count: " + ", ".join(f"{h} {100 * counts[h] / counts[mos]:.1f}%" for h in sized) + ")"
            if sized
            else ""
        )
        + "."
    )


#: two tables whose mini models have the same sizes: how far their cost ratios differ shows the timing noise
TWIN_COST_TABLES = ("mt-en-de", "mt-en-fr")


def timing_noise(objs: Dict[str, Dict[str, Any]]) -> str:
    """A sentence on how far one timing run can be trusted: the largest gap between the cost ratios of
    :data:`TWIN_COST_TABLES` (same model sizes, so a gap is noise), or "" until both are measured."""
    a, b = ((objs.get(t) or {}).get("costs") or {} for t in TWIN_COST_TABLES)
    if not a or not b:
        return ""
    gaps = [
        (abs(a["ratios"][h][k] / b["ratios"][h][k] - 1), h, k)
        for h in a["ratios"]
        if h in b["ratios"]
        for k in a["ratios"][h]
        if h != "softmax" and k in b["ratios"][h]
    ]
    gap, head, key = max(gaps)
    return (
        f"{' and '.join(TWIN_COST_TABLES)} time mini models of the same sizes and their ratios differ by up "
        f"to {gap:.0%} ({head}, {key}: {a['ratios'][head][key]:.2f}x and {b['ratios'][head][key]:.2f}x): read "
        f"smaller differences as noise."
    )


def added_heads(costs: Dict[str, Any]) -> str:
    """The sentence on heads timed after the table's cost run (:func:`recipes.reproduce.engine.costs.merge_costs`)."""
    added = list(costs.get("added") or {})
    if not added:
        return ""
    return (
        f" {', '.join(added)}: added to the table later, timed beside softmax again in a run of "
        f"{'its' if len(added) == 1 else 'their'} own (ratios to that run's softmax; the budget is that run's)."
    )


def minutes_by_head(cells: List[Dict[str, Any]], key: str) -> Dict[str, List[float]]:
    """``{head: [minutes]}``: each cell's ``key`` (seconds) in minutes, for the cells that recorded one."""
    out: Dict[str, List[float]] = {}
    for c in cells:
        if c.get(key):
            out.setdefault(c["head"], []).append(c[key] / 60)
    return out


def scale_phrase(obj: Dict[str, Any], full_only: bool) -> str:
    """What the section's **Scale** says: the rows' scale (and, while some heads are still sweeping, which heads have
    their rate; once none is, how many of the seed cells fixed before the runs are still to train), or why there are
    no rows yet."""
    sweep = obj.get("sweep") or {}
    waiting = [h for h, s in sweep.items() if s.get("chosen") is None]
    if obj["rows"]:
        if not waiting:
            planned = obj.get("seeds_planned") or {}
            have: Dict[str, int] = {}  # each head's most seeds over its rows (the cost columns' rows have none)
            if planned:
                for r in obj["rows"]:
                    have[r["head"]] = max(have.get(r["head"], 0), len(r["seeds"]))
            left = sum(max(0, n - have.get(h, 0)) for h, n in planned.items())
            if not left:
                return obj["rows"][0]["scale"]
            return (
                f"{obj['rows'][0]['scale']}, running: every head's rate chosen; {left} of the "
                f"{sum(planned.values())} seed cells fixed before the runs still train"
            )
        chosen = [h for h in sweep if h not in waiting]
        return (
            f"{obj['rows'][0]['scale']}, running: the rate chosen for {', '.join(chosen)}, whose seeds train; the "
            f"learning-rate sweep of {', '.join(waiting)} running"
        )
    if full_only:
        return "full only (the plan below; nothing run here)"
    if obj.get("sweep"):
        return "mini, learning-rate sweep running (no head has its rate and seeds yet)"
    return "mini, no cell finished yet"


def scored_part(cells: List[Dict[str, Any]]) -> str:
    """ ", N of them scored (...)" where some trained cells have no scores yet, else ""."""
    scored = sum(1 for c in cells if any(c.get(metric) for metric in SCORES))
    if scored == len(cells):
        return ""
    return f", {scored} of them scored so far (a cell is scored right after its training)"


def models_line(cells: List[Dict[str, Any]]) -> str:
    """Which models the cells ran (tables of several models, lm-gpt2), or ""."""
    models = sorted({m for c in cells for m in c.get("models") or []})
    return f"Models run: {', '.join(models)} (the table's other models have no cells here)." if models else ""


def finished_sentences(cells: List[Dict[str, Any]], scored: List[Dict[str, Any]], table: str) -> str:
    """The sentences after **Scale**: cells finished, parameters per row, the cap, misrecorded commands."""
    done = "".join(
        f" {t}"
        for t in (
            f"Cells finished: {len(cells)} ({', '.join(sorted({c['head'] for c in cells}))})" + scored_part(cells) + "."
            if cells
            else "",
            models_line(cells),
            parameters_line(scored),
            cap_sentence(scored),
        )
        if t
    )
    return done + misrecorded(cells, table)


def training_time_sentence(walls: Dict[str, List[float]], seeds: Dict[str, int]) -> str:
    """Each head's mean wall-clock minutes a cell (``walls`` from :func:`minutes_by_head`, ``seeds`` cells a head)."""
    times = ", ".join(
        f"{h} {sum(v) / len(v):.1f}"
        + (f" ({len(v)} of its {seeds[h]} seeds logged a time)" if len(v) < seeds[h] else "")
        for h, v in walls.items()
    )
    return (
        "Wall-clock training time of a cell (fairseq's train_wall or the recipe's, minutes, mean over the seeds that "
        f"logged one; other runs shared the machine's 2 cores, so it is no measure of cost): {times}."
    )


def cpu_time_sentence(cpu: Dict[str, List[float]], seeds: Dict[str, int]) -> str:
    """Each head's mean CPU minutes a cell: what the cells cost, whatever else ran beside them."""
    return (
        "CPU time of a cell's training (user + system, minutes, mean over the seeds that recorded it; "
        "unlike the wall-clock above, not inflated by the jobs beside it): "
        + ", ".join(f"{h} {sum(v) / len(v):.1f} ({len(v)} of {seeds[h]} seeds)" for h, v in cpu.items())
        + "."
    )


def same_memory_sentence(c: Dict[str, Any], noise: str, grid_min: int) -> str:
    """The sentence under the cost table: the batch, the memory budget, each head's largest batch within it."""
    batches = ", ".join(f"{h} {b['all'] or 'none'}/{b['out'] or 'none'}" for h, b in c["same_mem_batch"].items())
    unit = c.get("unit", "sentences")
    return (
        f"Same batch: {c['batch']} {unit}. Same memory: softmax's peak at {c['batch']} {unit} "
        f"x {c['budget_factor']} (all layers {c['budget_bytes']['all'] / 2**20:.0f} MiB, output "
        f"layer {c['budget_bytes']['out'] / 2**20:.0f} MiB); largest batch that fits, all layers / "
        f"output layer: {batches} (none: not even {grid_min} fit); time per sequence at that batch. "
        f"{c['threads']} thread"
        f"{'s' if c['threads'] != 1 else ''}, one timing run per head on a 2-core machine shared "
        f"with the training runs.{added_heads(c)} {noise}"
    ).rstrip()


def sweep_intro(smoothed: bool) -> str:
    """The line above the learning-rate table."""
    return (
        "Learning rate per head: best valid loss of seed 1 at every rate ("
        + ("the label-smoothed loss the cells train and stop on, then the NLL of that checkpoint; " if smoothed else "")
        + "epoch of the best, why it stopped; bold: the chosen rate, chosen on valid only):"
    )


def nll_rate_sentence(moved: Dict[str, float]) -> str:
    """Whether the NLL of the same checkpoints would choose other rates than the label-smoothed loss did."""
    return (
        "The NLL of the same checkpoints would choose another rate for "
        + ", ".join(f"{h} ({sweep_rules.rate_key(lr)})" for h, lr in moved.items())
        if moved
        else "The NLL of the same checkpoints chooses the same rate for every head whose sweep is done"
    ) + "."


def borrowed_sentence(borrowed: List[str]) -> str:
    """The heads that train at another table's rate (``--lr-from``)."""
    return (
        f"Not swept here: the heads marked with {' / '.join(borrowed)}'s choice train at the rate that "
        f"table's sweep chose on its own valid split (`--lr-from`), a cut to fit the compute budget; "
        f"their rate may not be this table's best."
    )


def compute_sentence(spent: Dict[str, float]) -> str:
    """The table's training CPU-hours, in the rates not chosen and in the chosen rates' seeds."""
    return (
        f"Compute: {spent['total']:.1f} CPU-core-hours of training for this table ({spent['sweep']:.1f} in "
        f"the rates not chosen, {spent['chosen']:.1f} in the chosen rates' seeds; scoring excluded)."
    )


def comparisons_intro(with_claims: bool) -> str:
    """The line above the paired comparisons' table."""
    return (
        "Paired comparisons (head minus baseline, same seeds; Holm-adjusted over this table's test "
        "comparisons; valid rows are described, not tested, as valid chose the rates and checkpoints where the "
        "table chooses any; detectable: the smallest true difference each test comparison finds with 80% power at "
        "0.05 / m, from its seeds' paired spread"
        + ("; paper's difference: the paper's relative difference at our baseline's mean" if with_claims else "")
        + "):"
    )


def equal_compute_intro(clock: str, smoothed: bool, with_ratios: bool) -> str:
    """The line above the equal-compute table (``clock``: "cpu" or wall-clock seconds)."""
    seconds = (
        "CPU seconds (each cell's logged seconds scaled by its recorded CPU time over them, which takes "
        "out the waiting for a core shared with other jobs; a cell's validations included)"
        if clock == "cpu"
        else "seconds (wall-clock on one core each, beside other jobs on a shared 2-core machine, so they carry noise)"
    )
    return (
        "Equal compute: each head's lowest valid NLL (bits per token"
        + (
            "; not the label-smoothed loss the cells train and stop on, which also rewards the probability "
            "a head leaves on every word of the vocabulary, more of it in a mixture's tail than in one "
            "softmax's"
            if smoothed
            else ""
        )
        + ") within the updates, and within the training "
        f"{seconds}, that softmax's cell of the same seed took to its stop, against softmax's lowest; a head is "
        "read at its last validation within that budget, so a head validated once an epoch may be read up to an "
        "epoch short of it "
        "(negative: the head gets lower for the same number of steps / the same bill"
        + (
            "; the cost column divides softmax's updates by the head's time per update measured in one "
            "benchmark process (the cost table above), the same bill without that noise"
            if with_ratios
            else ""
        )
        + "):"
    )


def epoch_lead_intro() -> str:
    """The line above the per-epoch table (:func:`recipes.reproduce.report.compare.epoch_lead_table`)."""
    return (
        "Per epoch: each head's valid NLL (bits per token) minus softmax's of the same seed, after every epoch "
        "both validated (mean over the paired seeds, the lowest and highest seed's in brackets; negative: below "
        "softmax; in bits, so that a lead of the same relative size reads the same at epoch 1's perplexity and at "
        "the last's). Description, not a test: whether a lead grows or shrinks as training goes on, read on the "
        "split that chose the rates:"
    )


def full_size_sentence(table: str, plan: Dict[str, Any]) -> str:
    """The **Full size** line: the dry run's command and each head's parameters, with the plan's note."""
    counts = ", ".join(f"{h} {n / 1e6:.1f}M" for h, n in plan["parameters"].items())
    return (
        f"**Full size** (`python -m recipes.reproduce {table} --scale full --dry-run`; GPUs, not run "
        f"here): parameters per head: {counts}. {plan.get('note', '')}"
    ).rstrip()
