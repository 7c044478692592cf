"""Running fairseq's own command line for a table: every command logged to ``commands.sh``, output to a log file,
progress from the training log, failures that name the cell and the log.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shlex
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

BIN = os.path.dirname(sys.executable)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PLUGIN = os.path.join(ROOT, "fairseq_plugin")
UPDATES = re.compile(r'"(?:train_inner_)?num_updates": "(\d+)"|num_updates[ =](\d+)')


def tool(name: str) -> str:
    """A console script (``fairseq-train`` ...) of this Python's environment, else from PATH."""
    path = os.path.join(BIN, name)
    return path if os.path.exists(path) else name


def shell_line(cmd: Sequence[str]) -> str:
    """``cmd`` as a shell line to run from the project root: this environment's scripts by their names, paths
    inside the project (or beside it, as ``../shared/data``) relative to it."""
    return relative_paths(
        shlex.join(os.path.basename(str(c)) if str(c).startswith(BIN + os.sep) else str(c) for c in cmd)
    )


def relative_paths(line: str) -> str:
    """``line`` with the project's absolute path, and its parent's, written relative to the project root."""
    parent = os.path.dirname(ROOT)
    return line.replace(ROOT + os.sep, "").replace(parent + os.sep, ".." + os.sep).replace(sys.executable, "python")


#: where a committed table file's commands say their table ran: the default output directory, from the project root
CANONICAL_OUT = "results/reproduce"


def canonical_paths(line: str, table: str) -> str:
    """``line`` (a recorded command) with the directory its table ran in written as the default output directory,
    ``results/reproduce/TABLE/``, and the rest by :func:`relative_paths`: a run made elsewhere (a git worktree beside
    the project, another ``--out``) reads as the same run from the project root."""
    return re.sub(rf"(?<!\S)\S*?/{re.escape(table)}/", f"{CANONICAL_OUT}/{table}/", relative_paths(line))


def located_paths(line: str, table: str, table_dir: str) -> str:
    """The inverse of :func:`canonical_paths` for a run in ``table_dir``: a committed command pointed at it."""
    return line.replace(f"{CANONICAL_OUT}/{table}/", relative_paths(os.path.abspath(table_dir)) + "/")


class Runner:
    """Runs a table's commands, recording each in ``TABLE_DIR/commands.sh`` (once; reruns add only new lines)."""

    def __init__(self, table_dir: str, log=print, progress: bool = True):
        self.table_dir = table_dir
        self.log = log
        self.progress = progress
        self.commands_path = os.path.join(table_dir, "commands.sh")

    def record(self, cmd: Sequence[str], comment: Optional[str] = None) -> str:
        """Add ``cmd`` (and a ``# comment`` line before it) to commands.sh unless it is there; return the line."""
        line = shell_line(cmd)
        os.makedirs(self.table_dir, exist_ok=True)
        known = open(self.commands_path).read().splitlines() if os.path.exists(self.commands_path) else []
        if line not in known:
            with open(self.commands_path, "a") as f:
                if not known:
                    f.write(
                        "#!/bin/sh\n# every command `python -m recipes.reproduce` ran for this table, in order;\n"
                        "# run from the project root (fairseq-train needs --user-dir fairseq_plugin)\nset -e\n"
                    )
                f.write((f"# {comment}\n" if comment else "") + line + "\n")
        return line

    def run(
        self,
        cmd: Sequence[str],
        log_path: str,
        cell: str,
        comment: Optional[str] = None,
        total_updates: Optional[int] = None,
        env: Optional[Dict[str, str]] = None,
    ) -> str:
        """Run ``cmd`` (recorded first), its output to ``log_path`` (appended: a resumed run keeps the earlier
        log), with a progress bar over the updates when ``total_updates`` is given. Returns this run's output.
        A non-zero exit stops with the cell, the log file and its last lines."""
        self.record(cmd, comment)
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
        full_env = {**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}
        bar = None
        if total_updates and self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=total_updates, desc=cell, unit="upd", leave=False, file=sys.stderr)
        out: List[str] = []
        with open(log_path, "a") as log:
            log.write(f"$ {shell_line(cmd)}\n")
            log.flush()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            proc = subprocess.Popen(
                [str(c) for c in cmd],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=full_env,
                cwd=ROOT,
            )
            started, sampled = time.strftime("%Y-%m-%dT%H:%M:%S"), time.monotonic()
            record_cpu(log_path, proc.pid, started, 0.0)  # every process of the log has an entry from its start
            for line in proc.stdout:
                log.write(line)
                log.flush()  # the log shows progress as it happens (tail -f)
                out.append(line)
                if bar is not None:
                    m = UPDATES.search(line)
                    if m:
                        bar.n = min(total_updates, int(m.group(1) or m.group(2)))
                        bar.refresh()
                if time.monotonic() - sampled > CPU_SAMPLE_S:  # an interrupted process keeps what it spent
                    sampled = time.monotonic()
                    seconds = process_cpu_seconds(proc.pid)
                    if seconds is not None:
                        record_cpu(log_path, proc.pid, started, seconds)
            rc = proc.wait()
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            record_cpu(
                log_path,
                proc.pid,
                started,
                (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
                finished=True,
            )
        if bar is not None:
            bar.close()
        if rc != 0:
            tail = "".join(out[-15:])
            raise SystemExit(f"cell {cell} failed ({os.path.basename(str(cmd[0]))} exit {rc}); log: {log_path}\n{tail}")
        return "".join(out)


#: how often (seconds) a running command's CPU time is written beside its log
CPU_SAMPLE_S = 30.0


def process_cpu_seconds(pid: int) -> Optional[float]:
    """User + system CPU seconds the process ``pid`` has used so far, its threads included (from ``/proc``; None
    where there is no ``/proc``, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15 of stat


def cpu_path(log_path: str) -> str:
    """The file beside ``log_path`` that holds the CPU time of the processes the log records."""
    return log_path + ".cpu.json"


def record_cpu(log_path: str, pid: int, started: str, seconds: float, finished: bool = False) -> None:
    """Write the CPU ``seconds`` of process ``pid`` (started at ``started``) into :func:`cpu_path`: one entry per
    process (a resumed run adds one), updated while it runs, ``finished`` once it has exited (then the kernel's
    exact count of it and of its children)."""
    path = cpu_path(log_path)
    entries = json.load(open(path)) if os.path.isfile(path) else []
    entry = {"pid": pid, "started": started, "cpu_s": round(float(seconds), 2), "finished": finished}
    same = [i for i, e in enumerate(entries) if e["pid"] == pid and e["started"] == started]
    if same:
        entries[same[0]] = entry
    else:
        entries.append(entry)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(entries, f, indent=1)
    os.replace(tmp, path)


def cpu_seconds(log_path: str, log_text: str) -> Optional[float]:
    """CPU seconds (user + system) of every process that wrote ``log_path`` (whose text, ``log_text``, the caller has
    read), from :func:`cpu_path`; an interrupted process counts what was last sampled (at most :data:`CPU_SAMPLE_S`
    short). None when it was not recorded for every process the log shows (a run begun before the recipes recorded
    it): the caller falls back to wall-clock."""
    path = cpu_path(log_path)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        entries = json.load(f)
    processes = sum(line.startswith("$ ") for line in log_text.splitlines())
    return sum(e["cpu_s"] for e in entries) if len(entries) >= processes else None


def training_done(log_path: str) -> bool:
    """Whether the fairseq-train run logged in ``log_path`` ended (stopped early or at its cap): running it again
    would train past its stopping point."""
    if not os.path.isfile(log_path):
        return False
    with open(log_path) as f:
        text = f.read()
    last_run = text[text.rfind("\n$ ") + 1 :] if "\n$ " in text else text
    return "done training in" in last_run


def parse_train_wall(log_text: str) -> Optional[float]:
    """Seconds spent training: fairseq-train's clock at its last finished epoch (the ``train_wall`` of the epoch
    lines counts from the process's start), summed over the processes of a resumed run (a clock that goes back is a
    new process; an epoch cut by the interruption is not counted), or the sum of the training times that
    ``softmax-heads finetune`` prints (``valid perplexity after N steps: P (Ts)``), one per model of the log."""
    epochs = [float(w) for w in re.findall(r'\| train \| .*"train_wall": "([\d.]+)"', log_text)]
    if epochs:
        ends = [w for w, after in zip(epochs, epochs[1:] + [0.0]) if after < w]  # each process's last epoch
        return sum(ends)
    walls = re.findall(r'"train_wall": "([\d.]+)"', log_text)
    if walls:
        return float(walls[-1])
    recipe = re.findall(r"after \d+ steps: [\d.]+ \(([\d.]+)s\)", log_text)
    return sum(float(t) for t in recipe) if recipe else None
