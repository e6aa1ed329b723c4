"""A run without ``--duration`` ends once every spout is done (or at
``--max-tuples``). A shell spout's input never ends as far as the host can
tell (Storm's neither): it is done once two ``next``s in a row bring nothing
and its trees are done, but before its first emit in the run it gets
``multilang.spout.start.secs`` to start (two empty ``next``s alone ended a
trial's run at once, its spout still connecting to its source: nothing done,
exit 0)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPOUT = Path(__file__).resolve().parent / "components" / "slow_spout.py"
_SCRIPT = Path(sys.executable).parent / "multilang"
ML = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-c", "from multilang._cli.entry import main; main()"]
SAID = ("[summary] spout 'items' emitted nothing: its `next`s brought nothing for 0 s (multilang.spout.start.secs "
        "in the topology conf), so the run took it for done; a spout slower to start needs more "
        "(-c multilang.spout.start.secs=30), or --duration")


def _topology(tmp_path: Path, *spout_args: object) -> Path:
    topo = tmp_path / "slow.toml"
    topo.write_text(f"""\
[spouts.items]
command = ["python", {json.dumps(str(SPOUT))}, {", ".join(json.dumps(str(a)) for a in spout_args)}]
fields = ["item"]

[bolts.echo]
command = ["python", {json.dumps(str(ROOT / "examples" / "python" / "split_bolt.py"))}]
fields = ["item"]
inputs = [{{ source = "items", grouping = "shuffle" }}]

[output]
component = "echo"
""")
    return topo


def _run(topo: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    p = subprocess.run(ML + ["run", str(topo), "--no-progress", *args], capture_output=True, text=True,
                       timeout=120, cwd=topo.parent)
    assert p.returncode == 0, p.stderr[-3000:]
    return p, sorted(json.loads(line)["item"] for line in p.stdout.splitlines())


@pytest.mark.parametrize("workers", [1, 2])
def test_a_spout_slow_to_start_is_waited_for(tmp_path, workers):
    # Nothing for its first second of its own clock, well within the default 5 s.
    p, items = _run(_topology(tmp_path, 1, 10), "--workers", str(workers))
    assert items == sorted(f"item{i}" for i in range(10))
    assert "emitted nothing" not in p.stderr


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("limit", [[], ["--max-tuples", "100"]])
def test_a_spout_that_never_emits_ends_the_run_with_a_line_that_says_so(tmp_path, workers, limit):
    # Quiet for ten minutes: taken for done at once with multilang.spout.start.secs = 0 (two empty
    # nexts), and the summary says that it emitted nothing, for how long, and what to set for a spout
    # slower to start. With --max-tuples too: the run ended short of it (a trial's had no line).
    p, items = _run(_topology(tmp_path, 600, 10), "--workers", str(workers), "-c", "multilang.spout.start.secs=0",
                    *limit)
    assert items == []
    assert SAID in p.stderr.splitlines()


def test_the_line_names_the_spouts_own_setting_which_wins_over_the_topology_conf(tmp_path):
    # A spout's own conf wins over -c: the line says so, and advises raising it there (a trial's line
    # advised -c, which would have changed nothing).
    topo = _topology(tmp_path, 600, 10)
    topo.write_text(topo.read_text().replace('fields = ["item"]\n', 'fields = ["item"]\n'
                                             'conf = { "multilang.spout.start.secs" = 0.1 }\n', 1))
    p, items = _run(topo, "-c", "multilang.spout.start.secs=30")
    assert items == []
    assert ("[summary] spout 'items' emitted nothing: its `next`s brought nothing for 0.1 s (multilang.spout.start.secs"
            " in its conf), so the run took it for done; a spout slower to start needs more (raise "
            "multilang.spout.start.secs in its conf), or --duration") in p.stderr.splitlines()


def test_after_its_first_emit_a_spout_is_done_when_two_nexts_bring_nothing(tmp_path):
    # Half its items, then a pause of ten minutes: the run ends with the first half (the start window
    # is for a spout that has emitted nothing yet), and no line says it emitted nothing.
    p, items = _run(_topology(tmp_path, 0, 6, 600))
    assert items == ["item0", "item1", "item2"]
    assert "emitted nothing" not in p.stderr
