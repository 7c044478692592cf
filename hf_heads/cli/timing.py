"""Wall-clock timing and peak memory for benchmarks: functions measured side by side in one process.

Timings on a shared CPU drift by 2x within a minute, so every function is timed in interleaved
rounds (each round runs every function over the same queries, in rotating order) and the median
round is reported. Speed-ups are ratios of medians taken in the same run.

Peak memory (:func:`peak_memory`): the largest rise of the process's resident set during one call, sampled by a
thread; measure it in a process started with :data:`MALLOC_ENV`, whose glibc returns freed memory at once (else
a later call's peak hides in memory kept for reuse).
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, Iterator, Sequence

import torch

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: environment of a memory-measuring process: every allocation above 64 KiB mapped on its own, returned when freed
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def time_per_call(fns: Dict[str, Callable], queries: Sequence, rounds: int = 7, warmup: int = 1) -> Dict[str, float]:
    """Median seconds per call of each ``fn(query)`` over ``queries``, in ``rounds`` interleaved rounds."""
    names = list(fns)
    samples: Dict[str, list] = {n: [] for n in names}
    with torch.no_grad():
        for r in range(warmup + rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for n in order:
                fn = fns[n]
                t = time.perf_counter()
                for q in queries:
                    fn(q)
                if r >= warmup:
                    samples[n].append((time.perf_counter() - t) / len(queries))
    return {n: statistics.median(v) for n, v in samples.items()}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def peak_memory(step: Callable[[], None], repeats: int = 3) -> float:
    """Median over ``repeats`` runs of the peak rise of the resident set during ``step()``, in bytes."""
    peaks = []
    for _ in range(repeats):
        gc.collect()
        base = _rss()
        top = [base]
        done = threading.Event()

        def watch(done, top):
            while not done.is_set():
                top[0] = max(top[0], _rss())
                time.sleep(0.0005)

        watcher = threading.Thread(target=watch, args=(done, top), daemon=True)
        watcher.start()
        try:
            step()
        finally:
            done.set()
            watcher.join()
        peaks.append(max(top[0], _rss()) - base)
    return statistics.median(peaks)


#: the busy neighbour: another process multiplying 512 x 512 matrices on one thread, as a second job on a shared
#: machine would (its own environment: OpenMP's default wait policy, whatever this process uses)
NEIGHBOUR = (
    "import torch\ntorch.set_num_threads(1)\na = torch.randn(512, 512)\nwhile True:\n    a = torch.tanh(a @ a)\n"
)


@contextlib.contextmanager
def busy_neighbour(processes: int = 1) -> Iterator[list]:
    """While the block runs, ``processes`` other processes keep one core each busy with matmuls (started, and
    given a second to start computing, before the block; killed after it); yields their ``Popen`` objects."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", NEIGHBOUR],
            env={**env, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(processes)
    ]
    try:
        time.sleep(1.0)
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def busy_report(quiet: Dict[str, float], busy: Dict[str, float], baseline: str) -> Dict[str, Dict[str, float]]:
    """Per function: seconds quiet and busy, its ratio to ``baseline`` in each, and its slowdown (busy / quiet)
    against the baseline's own (``relative_slowdown``: 1 = it suffers no more than the baseline)."""
    base = busy[baseline] / quiet[baseline]
    return {
        n: {
            "quiet_s": quiet[n],
            "busy_s": busy[n],
            "quiet_ratio": quiet[n] / quiet[baseline],
            "busy_ratio": busy[n] / busy[baseline],
            "slowdown": busy[n] / quiet[n],
            "relative_slowdown": busy[n] / quiet[n] / base,
        }
        for n in quiet
    }
