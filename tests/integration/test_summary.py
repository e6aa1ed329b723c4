"""The end-of-run summary of ``multilang run`` names what each shell
component's processes negotiated (extensions, or standard protocol) and the
last value of each of its ``metrics`` (issue "See what a topology is doing")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from multilang._cli.summary import print_summary
from multilang.shellbolt import RunResult

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
COMPONENTS = Path(__file__).resolve().parent / "components"
_SCRIPT = Path(sys.executable).parent / "multilang"
ML = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-c", "from multilang._cli.entry import main; main()"]


def _lines_spout(tmp_path: Path) -> str:
    """A topology's spout "lines": the README's sentence spout over 40 lines."""
    sentences = tmp_path / "s.txt"
    sentences.write_text("".join(f"line {i}\n" for i in range(40)))
    return f"""\
[spouts.lines]
command = ["python", {json.dumps(str(EXAMPLES / "python" / "sentence_spout.py"))}, {json.dumps(str(sentences))}]
fields = ["sentence"]
"""


def test_the_summary_names_the_negotiated_extensions_and_the_metrics(tmp_path):
    topo = tmp_path / "t.toml"
    topo.write_text(_lines_spout(tmp_path) + f"""
[bolts.measured]
command = ["python", {json.dumps(str(COMPONENTS / "metrics_bolt.py"))}]
fields = ["sentence"]
inputs = [{{ source = "lines", grouping = "shuffle" }}]

[bolts.plain]
command = ["python", {json.dumps(str(EXAMPLES / "python" / "split_bolt.py"))}]
fields = ["word"]
inputs = [{{ source = "measured", grouping = "shuffle" }}]
conf = {{ "multilang.extensions" = [] }}
""")
    p = subprocess.run(ML + ["run", str(topo), "--no-progress"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    (line,) = [ln for ln in p.stderr.splitlines() if ln.startswith("[summary] protocol: ")]  # one line for all
    said = dict(part.split(" ") for part in line[len("[summary] protocol: "):].split("; "))
    assert said == {"lines": "batch",  # our Python library accepts batch when offered
                    "measured": "batch",
                    "plain": "standard"}  # offered nothing: multilang.extensions = []
    counts = [ln for ln in p.stderr.splitlines() if ln.startswith("[summary]   plain: ")]
    assert counts == ["[summary]   plain: emitted 80, executed 40, acked 40, failed 0, restarts 0, errors 0"]
    metrics = [ln for ln in p.stderr.splitlines() if ln.startswith("[summary]     measured metrics: ")]
    assert len(metrics) == 1
    assert 'seen=40' in metrics[0] and '"nested":{"x":2}' in metrics[0] and 'note="a string"' in metrics[0]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_component_whose_processes_never_finished_the_handshake_is_not_called_standard(tmp_path, workers):
    # A process that exits before its handshake negotiated nothing: the
    # protocol line said "standard" for it, as if it had spoken the protocol.
    # The bolt's first processes exit once the spout has handshaken (it
    # marks its initialize), so that the run gives up after the spout's
    # handshake however slowly its process starts (on a loaded machine it
    # gave up first, and the spout too was "no handshake").
    marker = tmp_path / "spout-up"
    spout = tmp_path / "marked_spout.py"
    spout.write_text(f"""import pathlib, sys
sys.path.insert(0, {str(EXAMPLES / "python")!r})
from sentence_spout import SentenceSpout


class Marked(SentenceSpout):
    def initialize(self, conf, context):
        super().initialize(conf, context)
        pathlib.Path({str(marker)!r}).touch()


Marked().run()
""")
    broken = tmp_path / "broken.py"
    broken.write_text(f"""import os, time
end = time.monotonic() + 60
while not os.path.exists({str(marker)!r}) and time.monotonic() < end:
    time.sleep(0.01)
raise SystemExit(3)
""")
    topo = tmp_path / "t.toml"
    topo.write_text(_lines_spout(tmp_path).replace(json.dumps(str(EXAMPLES / "python" / "sentence_spout.py")),
                                                   json.dumps(str(spout))) + f"""
[bolts.broken]
command = ["python", {json.dumps(str(broken))}]
fields = ["word"]
parallelism = 2
inputs = [{{ source = "lines", grouping = "shuffle" }}]
""")
    p = subprocess.run(ML + ["run", str(topo), "--no-progress", "--workers", str(workers)], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 1 and "gave up" in p.stderr, p.stderr
    (line,) = [ln for ln in p.stderr.splitlines() if ln.startswith("[summary] protocol: ")]
    assert line == "[summary] protocol: lines batch; broken no handshake", p.stderr


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_a_components_last_error_and_metrics_are_its_latest_tasks_on_any_number_of_workers(tmp_path, workers,
                                                                                           order):
    # The component's last error and each metric's last value: on 2 workers
    # its first worker's error (a trial saw an error from a second earlier),
    # and on any number its highest task's metrics, whichever came last.
    first, last = order
    items = [{"values": [first], "id": 1}, {"values": [last], "id": 2}]
    topo = tmp_path / "t.toml"
    # (max spout pending 1: the second cue goes out once both tasks acked the first, whatever the machine's pace)
    topo.write_text(f"""\
[topology.conf]
"topology.max.spout.pending" = 1

[spouts.cues]
command = ["python", {json.dumps(str(COMPONENTS / "scripted_spout.py"))}, {json.dumps(json.dumps({"items": items, "events": False}))}]
fields = ["n"]

[bolts.b]
command = ["python", {json.dumps(str(COMPONENTS / "reporting_bolt.py"))}]
fields = ["n"]
parallelism = 2
inputs = [{{ source = "cues", grouping = "all" }}]
""")
    metrics = tmp_path / "m.jsonl"
    p = subprocess.run(ML + ["run", str(topo), "--no-progress", "--workers", str(workers), "--metrics-file",
                             str(metrics)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    final = json.loads(metrics.read_text().splitlines()[-1])["components"]["b"]
    assert final["last_error"] == f"from index {last}", final
    assert final["metrics"] == {"last": last}, final
    assert f"[summary]     b metrics: last={last}" in p.stderr.splitlines(), p.stderr


def _state_line(capsys, **result) -> str:
    print_summary(RunResult(stats={}, completed=0, failed=0, timed_out=0, pending=0, gave_up=[], outputs=[],
                            state_path="/s/wc.sqlite", spouts=["sentences"], **result), 1.0)
    return next(line for line in capsys.readouterr().err.splitlines() if line.startswith("[summary] state"))


def test_a_stateful_bolt_that_never_completed_a_handshake_is_not_said_to_be_stateless(capsys):
    # A trial: the spout's worker killed each time before its processes started; the count bolt is stateful,
    # and the line said that no bolt of the topology accepted the state extension.
    exts = {"sentences": None, "split": ["batch"], "count": None}
    assert _state_line(capsys, extensions=exts) == (
        "[summary] state: count never completed a handshake, and no other bolt accepted the state extension "
        "(§9.7), so /s/wc.sqlite holds nothing from this run")
    exts = {"sentences": ["batch"], "split": ["batch"], "count": []}
    assert _state_line(capsys, extensions=exts) == (
        "[summary] state: no bolt of this topology accepted the state extension (§9.7), so /s/wc.sqlite holds "
        "nothing from this run")
