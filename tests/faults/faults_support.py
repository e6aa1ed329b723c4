"""Helpers for the fault-injection tests: tiny topologies, runs under a hard
time limit, pid tracking, and the three checks every fault test makes:

(a) what the run did (continued, restarted, gave up), from RunResult;
(b) nothing lost: every reliable spout id ends acked, and the sink got
    exactly the expected multiset of values;
(c) the error a user sees names the component, the task, the pid and the
    cause (and the stderr tail where there is one).

Components: tests/faults/components/ (stdlib-only raw components that break
rules on request) and the example Ruby and Node components. The process
checks (child pids, liveness, no orphans) and the generic topology run are
multilang.testing's; Run adds what these components report.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable

import pytest
import trio

from multilang import testing
from multilang.shellbolt import Runtime, ShellBolt, ShellSpout
from multilang.testing import TopologyRun

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
COMPONENTS = Path(__file__).resolve().parent / "components"
FAULTY_BOLT = COMPONENTS / "faulty_bolt.py"
NUMBERED_SPOUT = COMPONENTS / "numbered_spout.py"
EVENT_FIELDS = ["event", "msg_id"]

_SCRIPT = Path(sys.executable).parent / "multilang"
ML = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-c", "from multilang._cli.entry import main; main()"]

needs_ruby = pytest.mark.skipif(shutil.which("ruby") is None, reason="needs ruby")
needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="needs node")


# --- components ------------------------------------------------------------------------


def numbered_spout(n: int, *, fmt: str | None = None, per_next: int = 1, state: Path | None = None,
                   events: bool = True, fault: str | None = None, after: int = 0, once: Path | None = None,
                   fields: Iterable[str] = ("n",)) -> ShellSpout:
    argv = ["python", str(NUMBERED_SPOUT), str(n), "--per-next", str(per_next)]
    if fmt:
        argv += ["--format", fmt]
    if state:
        argv += ["--state", str(state)]
    if not events:
        argv += ["--no-events"]
    if fault:
        argv += ["--fault", fault, "--after", str(after)]
    if once:
        argv += ["--once", str(once)]
    return ShellSpout(argv, fields=list(fields), streams={"events": EVENT_FIELDS} if events else None)


def faulty_bolt(*, fault: str | None = None, after: int = 0, once: Path | None = None, startup: str | None = None,
                sleep: float = 0.0, fields: Iterable[str] = ("n",), flood_line: int | None = None,
                gate: Path | None = None, copies: int = 1) -> ShellBolt:
    argv = ["python", str(FAULTY_BOLT)]
    if copies != 1:
        argv += ["--copies", str(copies)]
    if fault:
        argv += ["--fault", fault, "--after", str(after)]
    if startup:
        argv += ["--startup", startup]
    if once:
        argv += ["--once", str(once)]
    if sleep:
        argv += ["--sleep", str(sleep)]
    if flood_line:
        argv += ["--flood-line", str(flood_line)]
    if gate:
        argv += ["--gate", str(gate)]
    return ShellBolt(argv, fields=list(fields))


FAST_CONF = {
    "multilang.shutdown.grace.secs": 1,
    "multilang.kill.grace.secs": 0.5,
}


def build(builder, **conf: Any):
    return builder.create_topology({**FAST_CONF, **conf}, resource_dir=EXAMPLES)


# --- runs --------------------------------------------------------------------------------


class Run(TopologyRun):
    def values(self, component: str, field_: str = "n") -> Counter:
        return Counter(_hashable(r[field_]) for r in self.records(component))

    def events(self, spout: str = "spout") -> list[tuple[str, Any]]:
        return [(r["event"], r["msg_id"]) for r in self.records(spout, "events")]

    def acked_ids(self, spout: str = "spout") -> set[Any]:
        return {m for e, m in self.events(spout) if e == "acked"}

    def failed_ids(self, spout: str = "spout") -> list[Any]:
        return [m for e, m in self.events(spout) if e == "failed"]


def _hashable(v: Any) -> Any:
    return json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v


def run_topology(topology, *, during: Callable[[Runtime], Awaitable[None]] | None = None, limit: float = 120,
                 **run_kw: Any) -> Run:
    """multilang.testing.run_topology under a time limit against a hang (120 s by default),
    collecting outputs and every component pid seen."""
    return testing.run_topology(topology, during=during, limit=limit, run_type=Run, **run_kw)


def task_ids(rt_or_topo: Any, component: str) -> list[int]:
    topo = getattr(rt_or_topo, "topology", rt_or_topo)
    return list(topo.components[component].tasks)


async def kill_mid_stream(rt: Runtime, component: str, sig: int = signal.SIGKILL, *, min_in_flight: int = 1,
                          timeout: float = 10) -> tuple[int, int, int]:
    """SIGKILL a process of ``component`` while it has tuples in flight.

    Freeze it (SIGSTOP), let the host read what it already wrote, and kill it
    only if tuples are really still in flight there; else let it go on and
    try again. Returns (task id, pid, in-flight count at the kill)."""
    with trio.fail_after(timeout):
        while True:
            for tid in task_ids(rt, component):
                task = rt.tasks[tid]
                proc = task.proc
                if proc is None or proc.proc is None or proc.pid is None or len(task.in_flight) < min_in_flight:
                    continue
                pid = proc.proc.pid
                os.kill(pid, signal.SIGSTOP)
                await trio.sleep(0.03)
                n = len(task.in_flight)
                if n >= min_in_flight and task.proc is proc:
                    os.kill(pid, sig)
                    if sig != signal.SIGKILL:
                        os.kill(pid, signal.SIGCONT)
                    return tid, pid, n
                os.kill(pid, signal.SIGCONT)
            await trio.sleep(0.002)


# --- assertions --------------------------------------------------------------------------


def assert_nothing_lost(run: Run, n: int, sink: str, expected: Counter, *, spout: str = "spout",
                        exact: bool = True, field_: str = "n") -> None:
    """(b): every reliable id 0..n-1 ended acked, and the sink got the
    expected multiset (exactly, or at least once each when ``exact`` is off)."""
    acked = run.acked_ids(spout)
    missing = sorted(set(range(n)) - acked)
    assert not missing, f"spout ids never acked: {missing[:20]} ({len(missing)} in all)"
    got = run.values(sink, field_)
    if exact:
        lost = expected - got
        dups = got - expected
        assert not lost and not dups, (f"sink multiset differs: lost {sorted(lost.items())[:10]}, "
                                       f"extra {sorted(dups.items())[:10]}")
    else:
        lost = set(expected) - set(got)
        assert not lost, f"lost at the sink: {sorted(lost)[:20]}"
    res = run.result
    assert res.pending == 0, f"{res.pending} trees still incomplete"


def names(text: str, component: str, task: int, pid: int | None) -> None:
    """(c): the text names the component, the task and the pid."""
    assert f"component {component!r} task {task}" in text or f"{component}:{task}" in text, text[:2000]
    if pid is not None:
        assert f"pid {pid}" in text, f"pid {pid} not named in: {text[:2000]}"


def error_logs(caplog, needle: str = "") -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("multilang") and r.levelno >= logging.WARNING and needle in r.getMessage()]


def restart_logs(caplog) -> list[str]:
    return error_logs(caplog, "restarting")


# --- the CLI ---------------------------------------------------------------------------------


def multilang_popen(args: list[str], cwd: Path = ROOT, **kw: Any) -> subprocess.Popen:
    return subprocess.Popen(ML + args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def toml_str(v: Any) -> str:
    return json.dumps(v)
