"""The README's streaming source snippet survives a restart with every sentence once.

README.md's ``register_source`` snippet (the sentence spout over
examples/data/alice.txt, a durable ``replayLog``) and the parquet sink named
after it run in a driver subprocess with its own SparkSession
(tests/spark/components/source_restart_driver.py), in a directory of the
test's own that links to the repo's examples. Once Spark's commit log holds
two batches, the driver's whole process group (the driver and its JVM) gets
SIGKILL; a second driver starts the query again on the same directories,
stops it gracefully (``query.stop()``) two batches later, starts it again and
runs it until the spout is drained (availableNow). Each restart brings a new
spout process that reads its file from the start; the sink must still hold
every sentence of the file exactly once (by line number, the spout's message
id: the text repeats in the file). No process of a run may outlive it.

The shared ``spark`` fixture only reads the sink at the end (through the file
sink's metadata log, as any Spark reader of it does).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ALICE = ROOT / "examples" / "data" / "alice.txt"
DRIVER = Path(__file__).resolve().parent / "components" / "source_restart_driver.py"
MAX_BATCH_SIZE = 100  # ~11 micro-batches over the 1,080 sentences
WAIT = 120  # seconds: bounds on events that normally take a few


def corpus_sentences() -> dict[int, str]:
    """What the spout emits: line number (its message id) -> the line, split and
    stripped as sentence_spout.py does, empty lines skipped."""
    lines = ALICE.read_text(encoding="utf-8").split("\n")
    return {i: s for i, s in enumerate(line.strip(" \t\n\r\f\v") for line in lines) if s}


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.is_dir() else 0


def wait_for(condition, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def processes_in(directory: Path) -> dict[int, str]:
    """Live processes whose working directory is ``directory`` (the driver's
    JVM, its Python workers and the spouts they start all inherit it)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if Path(os.readlink(entry / "cwd")) != directory:
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z":  # a zombie is dead, only not reaped yet
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


@pytest.fixture
def workdir(tmp_path):
    """A user's directory holding the examples; the snippet's relative paths
    (the spout's command, the replay log, the sink, the checkpoint) resolve here."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    yield work.resolve()
    leftovers = processes_in(work.resolve())
    for pid in leftovers:  # a failed test must not leave a JVM or a spout behind
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not leftovers, f"processes survived the test: {leftovers}"


def start_driver(workdir: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    log = open(workdir / f"driver-{time.monotonic_ns()}.log", "wb")
    return subprocess.Popen(
        [sys.executable, str(DRIVER), str(README), str(MAX_BATCH_SIZE), *args],
        cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=log,
        start_new_session=True,  # its own process group: one killpg reaches the driver and its JVM
    )


def finish_driver(proc: subprocess.Popen, workdir: Path) -> list[dict]:
    try:
        out, _ = proc.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(workdir.glob("driver-*.log")))
    assert proc.returncode == 0, f"the driver failed ({proc.returncode}):\n{logs}"
    return [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]


def assert_every_sentence_once(spark, workdir: Path) -> None:
    rows = [(json.loads(r["_msg_id"]), r["sentence"]) for r in spark.read.parquet(str(workdir / "out")).collect()]
    expected = corpus_sentences()
    seen = Counter(line for line, _ in rows)
    twice = sorted(line for line, n in seen.items() if n > 1)
    missing = sorted(set(expected) - set(seen))
    assert not twice and not missing, (
        f"{len(rows)} rows for {len(expected)} sentences: {len(twice)} lines more than once "
        f"(e.g. {twice[:5]}), {len(missing)} missing (e.g. {missing[:5]})"
    )
    assert dict(rows) == expected  # and each with its own text


def test_killed_then_stopped_query_restarted_on_the_same_dirs_writes_every_sentence_once(spark, workdir):
    checkpoint = workdir / "checkpoints" / "q1"
    n_batches = -(-len(corpus_sentences()) // MAX_BATCH_SIZE)

    # 1. kill -9 midway: the driver and its JVM, at once.
    first = start_driver(workdir)
    wait_for(lambda: committed_batches(checkpoint) >= 2 or first.poll() is not None,
             "the first run to commit two batches")
    assert first.poll() is None, f"the first run ended before the kill (status {first.returncode})"
    running = " | ".join(processes_in(workdir).values())
    assert "java" in running and "sentence_spout.py" in running, running  # what must not survive
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    # Its Python worker sees the JVM's socket close and exits; the spout sees EOF and exits.
    wait_for(lambda: not processes_in(workdir), "the killed run's JVM, workers and spout to exit", timeout=60)
    killed_at = committed_batches(checkpoint)
    assert killed_at + 4 <= n_batches, f"the kill landed too late ({killed_at} of {n_batches} batches)"

    # 2. Started again on the same directories: a new spout process reads its
    # file from the start. Midway (two more batches) the query is stopped
    # (query.stop()) and started again, a third spout process; it runs to the end.
    reports = finish_driver(start_driver(workdir, "--graceful"), workdir)
    assert [r["query"] for r in reports] == [1, 2], reports
    assert all(r["rows"] > 0 for r in reports), f"a restart did not land midway: {reports}"
    wait_for(lambda: not processes_in(workdir), "the finished run's JVM, workers and spout to exit", timeout=60)

    assert_every_sentence_once(spark, workdir)
