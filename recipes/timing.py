"""Wall-clock timing for benchmarks: functions measured side by side in one process.

Timings on a shared CPU drift by 2x within a minute, so every function is timed in interleaved
rounds (each round runs every function over the same queries, in rotating order) and the median
round is reported. Speed-ups are ratios of medians taken in the same run.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, Sequence

import torch


def time_per_call(fns: Dict[str, Callable], queries: Sequence, rounds: int = 7, warmup: int = 1) -> Dict[str, float]:
    """Median seconds per call of each ``fn(query)`` over ``queries``, in ``rounds`` interleaved rounds."""
    names = list(fns)
    samples: Dict[str, list] = {n: [] for n in names}
    with torch.no_grad():
        for r in range(warmup + rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                fn = fns[n]
                t = time.perf_counter()
                for q in queries:
                    fn(q)
                if r >= warmup:
                    samples[n].append((time.perf_counter() - t) / len(queries))
    return {n: statistics.median(v) for n, v in samples.items()}
