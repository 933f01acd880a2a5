"""What an idle ``engram up`` costs: % of one core per process over a minute.

    python -m bench.bench_idle [--seconds 60] [--settle 20] [--workers 2]

Starts ``python -m engram up`` on a temporary ENGRAM_HOME (embedded PostgreSQL
and valkey, the workers, the jobs worker, the dashboard, the watchdog), waits
until it is up and its children have settled (models loaded), then reads
``/proc/<pid>/stat`` of every process of it (``up`` and its descendants, and
the servers it recorded in its run file, with theirs) at the start and the end
of the window: user + system time, and the time of children that exited
meanwhile (a PostgreSQL backend, say). Prints % of one core per process and in
all, then stops ``up`` by its pid (SIGINT, as Ctrl-C would).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil  # type: ignore[import-untyped]

from engram import procs

REPO = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    own: float  # seconds of CPU: user + system
    reaped: float  # seconds of CPU of its children that exited and were waited for


def _stat(pid: int) -> tuple[float, float] | None:
    """(own, reaped children) CPU seconds, from /proc/<pid>/stat."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[1].split()  # after "pid (comm)": state is fields[0]
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime) / TICKS, (cutime + cstime) / TICKS


def _name(proc: psutil.Process) -> str:
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return "?"
    if "-m" in cmd and cmd.index("-m") + 1 < len(cmd):  # python -m engram [--log-level L] up
        module, *rest = cmd[cmd.index("-m") + 1 :]
        words = [a for a in rest if not a.startswith("-") and a.upper() != a]
        return " ".join([module, *words[:1]]) if module == "engram" else module
    first = Path(cmd[0]).name.split()[0].rstrip(":") if cmd else proc.name()
    return "postgres (server, backends, background)" if first == "postgres" else first


def _tree(roots: Iterable[int]) -> dict[int, psutil.Process]:
    procs: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                procs[proc.pid] = proc
        except psutil.Error:
            continue
    return procs


def _recorded_pids(home: Path) -> list[int]:
    """The processes ``up`` recorded in its run file (the servers are not its children)."""
    try:
        data = json.loads((home / "run.json").read_text())
    except (OSError, ValueError):
        return []
    return [int(p["pid"]) for p in data.get("processes", []) if p.get("pid")]


def sample(up_pid: int, home: Path) -> dict[int, Sample]:
    samples = {}
    for pid, proc in _tree([up_pid, *_recorded_pids(home)]).items():
        stat = _stat(pid)
        if stat is not None:
            samples[pid] = Sample(_name(proc), *stat)
    return samples


def wait_up(proc: subprocess.Popen[str], timeout: float) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"engram up exited ({proc.poll()}) before it was up")
        if line.startswith("engram is up"):
            return
    raise RuntimeError("engram up was not up in time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured window")
    parser.add_argument(
        "--settle", type=float, default=20.0, help="wait this long after it is up (model loads)"
    )
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="engram-idle-"))
    env = {
        **os.environ,
        "ENGRAM_HOME": str(home),
        "PYTHONPATH": str(REPO),
        "ENGRAM_WORKERS": str(args.workers),
    }
    for name in ("DATABASE_URL", "REDIS_URL"):  # its own servers, not the caller's
        env.pop(name, None)
    up = subprocess.Popen(
        [sys.executable, "-m", "engram", "--log-level", "WARNING", "up"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        wait_up(up, timeout=180)
        time.sleep(args.settle)
        first = sample(up.pid, home)
        start = time.monotonic()
        time.sleep(args.seconds)
        last = sample(up.pid, home)
        elapsed = time.monotonic() - start
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.stop_process(psutil.Process(up.pid), signal.SIGINT, 120)
        up.wait()
        shutil.rmtree(home, ignore_errors=True)
    _report(first, last, elapsed)


def _report(first: dict[int, Sample], last: dict[int, Sample], elapsed: float) -> None:
    by_name: dict[str, float] = {}
    for pid, end in last.items():
        begin = first.get(pid, Sample(end.name, 0.0, 0.0))
        used = (end.own - begin.own) + (end.reaped - begin.reaped)
        by_name[end.name] = by_name.get(end.name, 0.0) + used
    # A process that exited in the window: its time is on its parent (reaped), if any.
    print(f"\n## An idle `engram up`, {elapsed:.0f} s ({os.cpu_count()} CPUs)\n")
    print("| process | processes | % of one core |\n|---|---:|---:|")
    counts: dict[str, int] = {}
    for s in last.values():
        counts[s.name] = counts.get(s.name, 0) + 1
    for name, used in sorted(by_name.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {counts[name]} | {used / elapsed:.2%} |")
    print(f"| **total** | {len(last)} | **{sum(by_name.values()) / elapsed:.2%}** |")


if __name__ == "__main__":
    main()
