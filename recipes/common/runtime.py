"""The recipes' experiment runtime, one for every study: a cell is a json file (a finished cell is read, not run
again; :func:`claimed` splits the cells of a shared folder between the processes that run them), committed cells come
back from a page's json (:func:`restore`), a learning-rate grid grows past a best end and chooses the lowest valid loss
(:func:`choose_lr`, :func:`extend_grid`, :func:`grown_grid`), and what a cell cost is counted one way
(:func:`cpu_seconds`). The reproduced tables (``recipes.reproduce.engine``),
the bottleneck map and its joint check, the upgrade table and the Mixtape forms all run on it."""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence


def load_json(path: str) -> Any:
    """The JSON file at ``path``, or None when there is none."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def save_json(path: str, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically (a killed run never leaves half a file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=False, default=_json_default)
        f.write("\n")
    os.replace(tmp, path)


def file_md5(path: str) -> str:
    """The md5 of the file at ``path`` (a kept checkpoint's identity)."""
    import hashlib

    digest = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cpu_seconds(cell: Mapping[str, Any]) -> float:
    """A cell's CPU-core-seconds, the one account of every page, from what its kind of run recorded: its processes'
    CPU time (``cpu_s``, user + system, with its floor run's ``floor_cpu_s`` where it had one: the reproduced tables,
    the bottleneck map); the joint check's ``cpu_seconds``; an upgrade cell's curve (its process's ``cpu_seconds`` at
    the last epoch, else its training steps' ``train_cpu_seconds``); else its training seconds times its threads
    (``train_wall_s``: cells trained before the CPU time was recorded; on a core shared with other jobs this counts
    the waiting too, an upper bound); 0 with none of them."""
    if cell.get("cpu_s") is not None:
        return cell["cpu_s"] + cell.get("floor_cpu_s", 0)
    if cell.get("cpu_seconds") is not None:
        return cell["cpu_seconds"]
    curve = cell.get("curve") or []
    if curve and "cpu_seconds" in curve[-1]:
        return curve[-1]["cpu_seconds"]
    if any("train_cpu_seconds" in e for e in curve):
        return sum(e.get("train_cpu_seconds", 0) for e in curve)
    return (cell.get("train_wall_s") or 0.0) * (cell.get("threads") or 1)


@contextlib.contextmanager
def clock(record: Dict) -> Iterator[Dict]:
    """Time the block into ``record``: ``seconds`` (wall clock) and ``cpu_seconds`` (this process's CPU time, all
    its threads), what a step of a command says it took."""
    wall, cpu = time.perf_counter(), time.process_time()
    yield record
    record.update(seconds=time.perf_counter() - wall, cpu_seconds=time.process_time() - cpu)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextlib.contextmanager
def claimed(path: str) -> Iterator[bool]:
    """Claim the result file ``path`` for this process while the block runs: True when it is this process's to make,
    False when a running process of this host holds it (``path + ".lock"``, its host and pid; removed when the block
    ends). A lock left by a process that ended (killed, or on another machine) is taken over. Two processes that
    share a results folder so split its cells between them, each making what the other does not hold."""
    lock, me = path + ".lock", f"{socket.gethostname()} {os.getpid()}"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                with open(lock) as f:
                    host, pid = f.read().split()
            except (OSError, ValueError):  # being written by the process that just made it (or just removed)
                yield False
                return
            if host == socket.gethostname() and int(pid) != os.getpid() and _running(int(pid)):
                yield False
                return
            with contextlib.suppress(FileNotFoundError):
                os.remove(lock)  # its process has ended: the claim is free
            continue
        with os.fdopen(fd, "w") as f:
            f.write(me)
        break
    try:
        yield True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(lock)


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def choose_lr(best_losses: Mapping[float, float]) -> float:
    """The rate of the lowest best valid loss (``{rate: loss}``; the smaller rate on a tie)."""
    if not best_losses:
        raise ValueError("choose_lr: no finished sweep cell")
    return min(best_losses, key=lambda lr: (best_losses[lr], lr))


def extend_grid(
    rates: Sequence[float], best_losses: Mapping[float, float], factor: Optional[float], max_rates: int
) -> Optional[float]:
    """The next rate to try when the best so far is the smallest or largest tried (``best / factor`` or
    ``best * factor``; ``factor`` None: the grid's own step at that end, the ratio of its two end rates), or None:
    the best is inside the grid, a cell is missing, or ``max_rates`` are tried."""
    if len(rates) >= max_rates or any(lr not in best_losses for lr in rates):
        return None
    best, grid = choose_lr(best_losses), sorted(rates)
    if len(grid) < 2 and factor is None:
        return None
    if best == grid[-1]:
        return best * (factor or grid[-1] / grid[-2])
    if best == grid[0]:
        return best / (factor or grid[1] / grid[0])
    return None


def grown_grid(
    grid: Sequence[float], loss_of: Callable[[float], float], run: Callable[[float], Any], extra: int, digits: int = 6
) -> List[float]:
    """Run every rate of ``grid`` (``run(lr)``; a finished cell is read, not run again), then, while the lowest
    ``loss_of(lr)`` is at an end of the rates run, one rate a grid step past that end (the ratio of the two rates
    there, written to ``digits`` significant digits), at most ``extra`` more (:func:`extend_grid`). A diverged rate's
    loss counts as infinity, never the best; when every rate diverged the grid stops. Returns the rates run, sorted."""
    rates = sorted(grid)
    while True:
        for lr in rates:
            run(lr)
        losses = {lr: loss_of(lr) for lr in rates}
        if not any(math.isfinite(v) for v in losses.values()):
            return rates
        losses = {lr: v if math.isfinite(v) else math.inf for lr, v in losses.items()}
        more = extend_grid(rates, losses, None, len(grid) + extra)
        if more is None:
            return rates
        rates = sorted(rates + [float(f"{more:.{digits}g}")])


def restore(
    records: Iterable[Dict],
    destination: Callable[[Dict], Optional[str]],
    log=None,
    what: str = "",
    saved: Optional[Callable[[Dict], Dict]] = None,
) -> int:
    """Write each committed record (a page json's cells) to ``destination(record)``, its path in this run, where that
    file is missing (as ``saved(record)`` where given: the record as the run keeps it); ``destination`` returns None
    for a record this run would not make (another head, rate or setting). Returns how many it wrote (and says so
    through ``log`` as ``restored N WHAT``)."""
    copied = 0
    for record in records:
        path = destination(record)
        if path is not None and not os.path.exists(path):
            save_json(path, saved(record) if saved else record)
            copied += 1
    if log is not None and copied:
        log(f"restored {copied} {what}".rstrip())
    return copied


def cell(path: str, make: Callable[[], Optional[Dict]]) -> Optional[Dict]:
    """A cell's record: read from ``path`` when it is there, else made (``make()``) and saved there by this process,
    unless another running process holds it (:func:`claimed`): then None, to look again later."""
    if os.path.exists(path):
        return load_json(path)
    with claimed(path) as mine:
        if not mine:
            return None
        if not os.path.exists(path):  # (not saved by another process since the look above)
            record = make()
            if record is not None:
                save_json(path, record)
            return record
    return load_json(path)
