"""The live view of ``multilang run`` (multilang/_cli/live.py over
shellbolt/_observe/observe.py): on a fake terminal, as plain lines, and a stall.

Real processes; the runs end by themselves (until done, or --duration), or
by a signal once the view said what the test waits for: no sleeps for
synchronisation and no timing assertions."""

from __future__ import annotations

import io
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from multilang._cli.live import LiveView
from multilang.shellbolt import PythonBolt, PythonSpout, Runtime, ShellBolt, TopologyBuilder

ROOT = Path(__file__).resolve().parents[2]
SPLIT = ROOT / "examples" / "python" / "split_bolt.py"
ML = [sys.executable, "-c", "from multilang._cli.entry import main; main()"]
SENTENCES = [[f"the quick brown fox {i} jumps over the lazy dog"] for i in range(300)]
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _topology():
    b = TopologyBuilder()
    b.set_spout("sentences", PythonSpout(list(SENTENCES), fields=["sentence"]))
    b.set_bolt("split", ShellBolt(["python", str(SPLIT)], fields=["word"]), parallelism=2).shuffle_grouping("sentences")
    b.set_bolt("count", PythonBolt(lambda values: [], fields=["word"])).fields_grouping("split", ["word"])
    return b.create_topology({"multilang.shutdown.grace.secs": 1, "topology.max.spout.pending": 50},
                             name="livetest", resource_dir=ROOT)


def _run(view: LiveView):
    rt = Runtime(_topology())

    async def main():
        return await rt.run(until_done=True, progress=view)

    return rt, trio.run(main)


def _last_frame(screen: str) -> list[str]:
    """The lines of the last frame drawn in place (after the last cursor-up)."""
    last = screen.rsplit("F", 1)[-1] if re.search(r"\x1b\[\d+F", screen) else screen
    return [ANSI.sub("", line) for line in last.split("\n") if ANSI.sub("", line).strip()]


def test_the_live_view_on_a_terminal_ends_with_the_final_counts_per_component_and_task():
    term = FakeTerminal()
    view = LiveView(term, tty=True, tasks=True, width=120, height=40, interval=0.05)
    rt, result = _run(view)
    assert result.ok and result.completed == len(SENTENCES)
    frame = _last_frame(term.getvalue())
    head, header, *rows = frame
    assert head.startswith("livetest ") and f"{len(SENTENCES)} completed" in head and "0 in flight" in head
    assert "complete " in head and " ms" in head  # the trees' complete latency p50/p99
    assert header.split()[:6] == ["component", "rate/s", "flight", "queued", "acked", "failed"]
    cells = {r.split()[0]: r.split() for r in rows}
    split_tasks = [f"split:{t}" for t in rt.topology.components["split"].tasks]
    assert set(cells) == {"sentences", "split", "count", "sentences:" + str(rt.topology.components["sentences"].tasks[0]),
                          *split_tasks, f"count:{rt.topology.components['count'].tasks[0]}"}
    for name, s in result.stats.items():
        # acked and failed equal the final summary's; nothing in flight or queued at the end
        assert cells[name][2:6] == ["0", "0", str(s.acked), str(s.failed)], cells[name]
    assert sum(int(cells[k][4]) for k in split_tasks) == result.stats["split"].acked
    for name in ("sentences", "split", "count", *split_tasks):
        assert re.fullmatch(r"[\d.]+s?/[\d.]+s?", cells[name][6]), cells[name]  # latency p50/p99 present
    assert re.fullmatch(r"[01]\.\d\d", cells["split"][7])  # capacity of a bolt
    assert cells["sentences"][7] == "-"  # a spout has none
    assert all(len(line) <= 119 for line in frame)
    assert "STALLED" not in term.getvalue()


def test_without_a_terminal_the_live_view_writes_short_plain_lines():
    out = io.StringIO()
    rt, result = _run(LiveView(out, tty=False, interval=0.05))
    text = out.getvalue()
    assert "\x1b" not in text
    lines = text.splitlines()
    assert lines and all(line.startswith("[progress] ") and len(line) <= 120 for line in lines), lines
    assert any(re.match(r"\[progress\] [\d.]+s trees: \d+ in flight, \d+ completed, \d+ failed", ln) for ln in lines)
    # the latency and the tuples in flight both fit (issue 32: the latencies were cut off)
    assert any(re.match(r"\[progress\] [\d.]+s split: emitted \d+ \(\d+/s\) acked \d+ failed \d+ exec [\d.]+/[\d.]+ms"
                        r"( cap [\d.]+)? in flight \d+", ln) for ln in lines), lines


NEVER_ACKS = '''
from multilang import Bolt

class NeverAcks(Bolt):
    def process(self, tup):
        pass  # holds every tuple: its trees stay in flight and none completes

NeverAcks().run()
'''


def _never_acking_topology(tmp_path: Path, *, stall_secs: float, message_timeout: float = 30) -> Path:
    """A sentence spout (max spout pending 10) into a bolt that never acks."""
    (tmp_path / "never_acks.py").write_text(NEVER_ACKS)
    (tmp_path / "sentences.txt").write_text("one two\nthree four\n" * 50)
    toml = tmp_path / "stall.toml"
    toml.write_text(f'''
[topology]
name = "stall"
[topology.conf]
"topology.max.spout.pending" = 10
"topology.message.timeout.secs" = {message_timeout}
"multilang.progress.stall.secs" = {stall_secs}
"multilang.shutdown.grace.secs" = 0
"multilang.kill.grace.secs" = 0.2
[spouts.sentences]
command = ["python", {str(ROOT / "examples" / "python" / "sentence_spout.py")!r}, "sentences.txt"]
fields = ["sentence"]
[bolts.stuck]
command = ["python", "never_acks.py"]
fields = ["word"]
inputs = [{{ source = "sentences", grouping = "shuffle" }}]
'''.replace("'", '"'))
    return toml


@pytest.mark.parametrize("workers", [1, 2])  # (2: the spout and the bolt on different host workers)
def test_a_run_whose_trees_never_complete_is_reported_stalled(workers, tmp_path):
    toml = _never_acking_topology(tmp_path, stall_secs=0.5)
    # (4.5 s: frames at 2 and 4 s, the second well after the first trees, however slowly the processes start)
    p = subprocess.run([*ML, "run", str(toml), "--duration", "4.5", "--progress-tasks", "-o", "/dev/null",
                        "--workers", str(workers)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    progress = [ln for ln in p.stderr.splitlines() if ln.startswith("[progress]")]
    # a frame every 2 s without a terminal, none at the start, and none at the end (the summary follows;
    # that one would come less than an interval after the last)
    times = sorted({float(ln.split()[1].rstrip("s")) for ln in progress})
    assert times[0] >= 2.0 and all(b - a >= 1.5 for a, b in zip(times, times[1:])), progress
    stalled = [ln for ln in progress if "STALLED" in ln]
    assert stalled, p.stderr[-3000:]
    assert re.search(r"STALLED: 10 trees in flight, none completed for [\d.]+s \(over 0.5s\)",
                     stalled[0]), stalled[0]
    assert any(ln.split(" ", 2)[2].startswith("stuck: emitted 0 ") and " in flight 10" in ln for ln in progress)
    assert any(" stuck:" in ln for ln in progress)  # --progress-tasks: a line per task too
    assert all(len(ln) <= 100 for ln in progress)


@pytest.mark.parametrize("workers", [1, 2])
def test_trees_that_time_out_before_the_stall_time_are_reported_stalled(workers, tmp_path):
    """The message timeout (1 s) shorter than the stall time (3 s): each
    tree times out and is replayed before it is 2 s old (the expiry looks
    once a second), and none ever completes. The view said nothing, as it
    measured the stall from the oldest tree in flight; it counts from the
    first failure since the last completion too."""
    toml = _never_acking_topology(tmp_path, stall_secs=3, message_timeout=1)
    err = _run_until_stalled([*ML, "run", str(toml), "-o", "/dev/null", "--workers", str(workers)], tmp_path,
                             last="stuck")
    stalled = [ln for ln in err.splitlines() if ln.startswith("[progress]") and "STALLED" in ln]
    # (up to 10: a frame may come between a timeout and its replay)
    assert re.search(r"STALLED: \d+ trees in flight, none completed for [\d.]+s \(over 3s\)", stalled[0]), stalled[0]
    summary = next(ln for ln in err.splitlines() if ln.startswith("[summary] "))
    assert re.search(r"trees completed 0, failed [1-9]\d* \(timed out [1-9]", summary), summary


DOUBLE = '''\
from multilang import BasicBolt

class Double(BasicBolt):
    def process(self, tup):
        self.emit([tup.values[0] + "."])
        self.emit([tup.values[0] + ","])

Double().run()
'''


def _run_until_stalled(argv: list[str], cwd: Path, last: str) -> str:
    """Run ``argv`` (a ``multilang run`` without --duration) until the view
    has said STALLED and then shown the line of component ``last``, however
    long the processes took to start; then SIGTERM. --duration 60 only
    bounds a run that never says it. Returns its stderr."""
    proc = subprocess.Popen([*argv, "--duration", "60"], cwd=cwd, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if re.match(rf"\[progress\] [\d.]+s {last}: ", line) and any("STALLED" in ln for ln in lines):
                proc.send_signal(signal.SIGTERM)
                break
        err = "\n".join(lines) + "\n" + proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert any(ln.startswith("[progress]") and "STALLED" in ln for ln in lines), err[-3000:]
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    return err


def test_a_deadlocked_cycle_is_reported_stalled(tmp_path):
    """Two bolts feeding each other, each emitting two tuples per input:
    the trees never complete, and the inboxes fill until each bolt waits
    for room in the other's (backpressure deadlock). The view says
    STALLED once nothing has completed for the stall time."""
    (tmp_path / "double.py").write_text(DOUBLE)
    (tmp_path / "seeds.txt").write_text("a\nb\nc\n")
    toml = tmp_path / "cycle.toml"
    toml.write_text(f'''
[topology]
name = "cycle"
[topology.conf]
"multilang.progress.stall.secs" = 0.5
"multilang.shutdown.grace.secs" = 0
"multilang.kill.grace.secs" = 0.2
[spouts.seeds]
command = ["python", {str(ROOT / "examples" / "python" / "sentence_spout.py")!r}, "seeds.txt"]
fields = ["line"]
[bolts.a]
command = ["python", "double.py"]
fields = ["line"]
inputs = [{{ source = "seeds", grouping = "shuffle" }}, {{ source = "b", grouping = "shuffle" }}]
[bolts.b]
command = ["python", "double.py"]
fields = ["line"]
inputs = [{{ source = "a", grouping = "shuffle" }}]
'''.replace("'", '"'))
    err = _run_until_stalled([*ML, "run", str(toml), "-o", "/dev/null"], tmp_path, last="b")
    stalled = [ln for ln in err.splitlines() if ln.startswith("[progress]") and "STALLED" in ln]
    assert re.search(r"STALLED: 3 trees in flight, none completed for [\d.]+s \(over 0.5s\)", stalled[0]), stalled[0]
    summary = next(ln for ln in err.splitlines() if ln.startswith("[summary] "))
    assert "trees completed 0" in summary and "abandoned at stop 3" in summary, summary
    queued = [ln for ln in err.splitlines() if re.match(r"\[progress\] [\d.]+s [ab]: ", ln)]
    assert any(" queued " in ln for ln in queued), queued  # the cycle is full: tuples wait in the inboxes
