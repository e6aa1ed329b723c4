"""Helpers for the fault-injection tests: tiny topologies, runs under a hard
time limit, pid tracking, and the three checks every fault test makes:

(a) what the run did (continued, restarted, gave up), from RunResult;
(b) nothing lost: every reliable spout id ends acked, and the sink got
    exactly the expected multiset of values;
(c) the error a user sees names the component, the task, the pid and the
    cause (and the stderr tail where there is one).

Components: tests/faults/components/ (stdlib-only raw components that break
rules on request) and the example Ruby and Node components.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable

import pytest
import trio

from multilang.shellbolt import Runtime, ShellBolt, ShellSpout

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
COMPONENTS = Path(__file__).resolve().parent / "components"
FAULTY_BOLT = COMPONENTS / "faulty_bolt.py"
NUMBERED_SPOUT = COMPONENTS / "numbered_spout.py"
EVENT_FIELDS = ["event", "msg_id"]

_SCRIPT = Path(sys.executable).parent / "multilang"
ML = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-c", "from multilang.cli import main; main()"]

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
                sleep: float = 0.0, fields: Iterable[str] = ("n",), flood_line: int | None = None) -> ShellBolt:
    argv = ["python", str(FAULTY_BOLT)]
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
    return ShellBolt(argv, fields=list(fields))


FAST_CONF = {
    "multilang.shutdown.grace.secs": 1,
    "multilang.kill.grace.secs": 0.5,
}


def build(builder, **conf: Any):
    return builder.create_topology({**FAST_CONF, **conf}, resource_dir=EXAMPLES)


# --- process helpers ---------------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (zombies included), from /proc."""
    kids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            kids.append(int(d))
    return kids


def descendants_of(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = children_of(todo.pop())
        out += kids
        todo += kids
    return out


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def running(pid: int) -> bool:
    """The process exists and is not a zombie. A grandchild killed with its
    group is reparented to init and may stay a zombie until init reaps it:
    dead, not leaked."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# --- runs --------------------------------------------------------------------------------


@dataclass
class Run:
    result: Any
    runtime: Runtime
    outputs: list[tuple[float, dict[str, Any]]]
    pids: set[int] = field(default_factory=set)
    #: task id -> pids of its processes, in start order
    task_pids: dict[int, list[int]] = field(default_factory=dict)
    elapsed: float = 0.0

    def records(self, component: str, stream: str = "default") -> list[dict[str, Any]]:
        return [r for _, r in self.outputs if r.get("component") == component and r.get("stream") == stream]

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


def current_pid(rt: Runtime, task_id: int) -> int | None:
    task = rt.tasks[task_id]
    proc = getattr(task, "proc", None)
    if proc is not None and proc.proc is not None:
        return proc.proc.pid
    return None


async def _run_async(topology, during, limit, run_kw) -> Run:
    outputs: list[tuple[float, dict[str, Any]]] = []
    rt = Runtime(topology, on_output=lambda rec: outputs.append((trio.current_time(), rec)))
    run = Run(None, rt, outputs)

    async def sample_pids() -> None:
        while True:
            for task_id in rt.tasks:
                pid = current_pid(rt, task_id)
                if pid is not None:
                    run.pids.add(pid)
                    seen = run.task_pids.setdefault(task_id, [])
                    if not seen or seen[-1] != pid:
                        seen.append(pid)
            await trio.sleep(0.003)

    start = trio.current_time()
    with trio.fail_after(limit):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample_pids)
            if during is not None:
                nursery.start_soon(during, rt)
            run.result = await rt.run(**run_kw)
            nursery.cancel_scope.cancel()
    run.elapsed = trio.current_time() - start
    return run


def run_topology(topology, *, during: Callable[[Runtime], Awaitable[None]] | None = None, limit: float = 15,
                 **run_kw: Any) -> Run:
    """Run under trio with a hard time limit (every test: < ~15 s),
    collecting outputs and every component pid seen."""
    run_kw.setdefault("until_done", "duration" not in run_kw)
    return trio.run(_run_async, topology, during, limit, run_kw)


async def wait_for(pred: Callable[[], bool], timeout: float = 10, poll: float = 0.002) -> None:
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(poll)


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


def assert_no_orphans(run: Run) -> None:
    assert run.pids, "the run started component processes"
    left = [p for p in run.pids if not gone(p)]
    assert not left, f"component processes left behind (running or unreaped): {left}"
    assert children_of(os.getpid()) == [], "this process still has children after the run"


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
