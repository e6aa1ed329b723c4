"""Stateful bolts (spec/PROTOCOL.md §9.7, docs/STATE.md): the word count of
the README with its count bolt in Python, Ruby or Node (and a count bolt
written against the wire, no library), checked against a plain count of the
corpus after

* a count process is SIGKILLed mid-run (the run goes on: its state comes back
  from the last checkpoint, the trees since are replayed), and
* the ``multilang run`` host itself is SIGKILLed mid-run and the same command
  is run again with the same ``--state-dir`` (it resumes from the last
  checkpoint and skips the sentences that checkpoint reflects).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

from faults_support import EXAMPLES, ML, needs_node, needs_ruby
from multilang.testing import (Seen, cmdline, current_pid, descendant_pids, process_name, run_topology,
                               running)
from multilang.shellbolt._model.topology import load_topology
from multilang.shellbolt._replay.record import read_task
from multilang.testing import wait_until

HERE = Path(__file__).resolve().parent
PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
COPIES = 3  # 3,240 sentences, ~76,000 words: a few seconds per run

COUNT_BOLTS = {
    "python": pytest.param(["python", str(EXAMPLES / "python" / "count_bolt.py")], id="python"),
    "ruby": pytest.param(["ruby", str(EXAMPLES / "ruby" / "count_bolt.rb")], id="ruby", marks=needs_ruby),
    "node": pytest.param(["node", str(EXAMPLES / "node" / "count_bolt.js")], id="node", marks=needs_node),
    "wire": pytest.param(["python", str(HERE / "components" / "wire_stateful_count.py")], id="wire"),
}


def plain_count(text: str) -> dict[str, int]:
    """The split bolt's rules: ASCII whitespace, edge punctuation stripped, A-Z lowered."""
    words: Counter[str] = Counter()
    for line in text.split("\n"):
        for token in line.split():
            word = token.strip(PUNCT)
            word = "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in word)
            if word:
                words[word] += 1
    return dict(words)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    text = (EXAMPLES / "data" / "alice.txt").read_text(encoding="utf-8")
    path = tmp_path_factory.mktemp("corpus") / f"alice{COPIES}.txt"
    path.write_text(text * COPIES, encoding="utf-8")
    return path, plain_count(text * COPIES)


def _counts(out: str) -> dict[str, int]:
    """A word count's output lines as {word: count}."""
    return {json.loads(ln)["word"]: json.loads(ln)["count"] for ln in out.splitlines()}


def wordcount_toml(tmp_path: Path, corpus: Path, count_cmd: list[str], interval_ms: int = 200) -> Path:
    """The README's topology (examples/wordcount.toml) over ``corpus`` with
    ``count_cmd`` as its count bolt; checkpoints every ``interval_ms``."""
    text = (EXAMPLES / "wordcount.toml").read_text()
    text = text.replace('"python/sentence_spout.py", "data/alice.txt"',
                        f'"{EXAMPLES / "python" / "sentence_spout.py"}", "{corpus}"')
    text = text.replace('"ruby/split_bolt.rb"', f'"{EXAMPLES / "ruby" / "split_bolt.rb"}"')
    text = text.replace('command = ["node", "node/count_bolt.js"]', f"command = {json.dumps(count_cmd)}")
    text = text.replace('"topology.message.timeout.secs" = 30',
                        f'"topology.message.timeout.secs" = 30\n"topology.state.checkpoint.interval.ms" = {interval_ms}')
    assert str(corpus) in text and json.dumps(count_cmd) in text
    path = tmp_path / "wordcount.toml"
    path.write_text(text)
    return path


def counts_of(records) -> dict[str, int]:
    return {r["word"]: r["count"] for r in records}


@pytest.mark.parametrize("count_cmd", list(COUNT_BOLTS.values()))
def test_a_killed_count_process_gets_its_state_back_and_the_counts_are_exact(tmp_path, corpus, count_cmd):
    path, expected = corpus
    topo = load_topology(wordcount_toml(tmp_path, path, count_cmd))
    count_tasks = topo.components["count"].tasks
    killed: list[int] = []

    async def killer(rt):
        # mid-run: a third of the words counted, at least one checkpoint committed
        await wait_until(lambda: rt.stats["count"].acked > 25_000 and rt.checkpoints.committed > 0, timeout=60)
        pid = current_pid(rt, count_tasks[0])
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    run = run_topology(topo, during=killer, limit=120)
    res = run.result
    assert killed, "the count process was not killed mid-run"
    assert res.ok and res.stats["count"].restarts == 1, res
    assert res.rollbacks >= 1 and res.checkpoints >= 2 and res.stateful == ["count"]
    assert counts_of(res.outputs) == expected
    assert res.completed == len([ln for ln in path.read_text().split("\n") if ln.strip(" \t\r\f\v")])


@pytest.mark.parametrize("batch", [1, 100])
def test_batch_boundaries_change_nothing_through_kills_of_split_and_count(tmp_path, batch):
    # Issue 34: a sentence's words are released to count as one run when split
    # acks it (hold mode), and count's acks are held a batch at a time. A split
    # and a count process killed mid-run, at topology.producer.batch.size 1 and
    # 100: every sentence's tree completes once and every word is counted once.
    # (The corpus, 25,440 words: at batch size 1 each costs a round trip.)
    text = (EXAMPLES / "data" / "alice.txt").read_text(encoding="utf-8")
    path, expected = tmp_path / "alice.txt", plain_count(text)
    path.write_text(text, encoding="utf-8")
    toml = wordcount_toml(tmp_path, path, COUNT_BOLTS["python"].values[0])
    toml.write_text(toml.read_text().replace("[topology.conf]\n",
                                             f'[topology.conf]\n"topology.producer.batch.size" = {batch}\n'))
    topo = load_topology(toml)
    assert topo.conf["topology.producer.batch.size"] == batch
    killed: list[int] = []

    async def killer(rt):
        for component, after in (("split", 6_000), ("count", 15_000)):
            await wait_until(lambda: rt.stats["count"].acked > after and rt.checkpoints.committed > 0, timeout=60)
            pid = current_pid(rt, topo.components[component].tasks[0])
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    run = run_topology(topo, during=killer, limit=120)
    res = run.result
    assert len(killed) == 2, "both processes were killed mid-run"
    assert res.ok and res.stats["split"].restarts == 1 and res.stats["count"].restarts == 1, res
    assert counts_of(res.outputs) == expected
    assert res.completed == len([ln for ln in path.read_text().split("\n") if ln.strip(" \t\r\f\v")])


def _run_cli(toml: Path, state_dir: Path, *args: str, tmp: Path | None = None) -> subprocess.Popen:
    env = None if tmp is None else {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.Popen([*ML, "run", str(toml), "--state-dir", str(state_dir), "--no-progress", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)


@contextlib.contextmanager
def _reaped(run: subprocess.Popen) -> Iterator[None]:
    """The run's group is killed if the block ends before the run did (a
    failed wait, a timeout): nothing outlives the test."""
    try:
        yield
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.communicate()


def _scratch_of(pids: list[int], roots: list[Path]) -> list[Path]:
    """The host's scratch folders (shellbolt/_host/scratch.py) in ``roots`` that one of ``pids`` owns."""
    owned = []
    for root in roots:
        for p in root.glob("multilang-*"):
            try:
                if int((p / ".multilang-owner").read_text().split()[0]) in pids:
                    owned.append(p)
            except (OSError, ValueError, IndexError):
                pass
    return owned


def _committed_txid(db: Path) -> int:
    """The last committed checkpoint, read from the WAL-mode file while the
    run holds it: read-only where the run shares it (host workers read it
    too), else a copy of the file and its WAL (one worker locks it).

    Each copy is read in a folder of its own and its connection closed
    whatever happens: a copy taken mid-write fails to read, and a connection
    left to the garbage collector kept SQLite's in-process view of the
    probe file, so that every later copy of the same name read as that
    broken one (CI: no first checkpoint seen for 120 s while the run had
    committed 9)."""
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0)
        try:
            row = con.execute("SELECT value FROM meta WHERE key = 'txid'").fetchone()
            return int(row[0]) if row else 0
        finally:
            con.close()
    except sqlite3.Error:
        pass  # not there yet, or locked by its one writer
    try:
        data, wal = db.read_bytes(), db.with_name(db.name + "-wal").read_bytes()
    except FileNotFoundError:
        return 0
    with tempfile.TemporaryDirectory() as folder:
        probe = Path(folder) / "probe.sqlite"
        probe.write_bytes(data)
        probe.with_name("probe.sqlite-wal").write_bytes(wal)
        con = sqlite3.connect(probe)
        try:
            row = con.execute("SELECT value FROM meta WHERE key = 'txid'").fetchone()
        except sqlite3.DatabaseError:
            return 0  # a copy taken mid-write: the next poll takes another
        finally:
            con.close()
    return int(row[0]) if row else 0


def _gated(tmp_path: Path, corpus: Path, count_cmd: list[str]) -> tuple[Path, Path]:
    """The word count with a spout held at half its input until the gate
    exists: the run cannot end before a test has killed what it kills,
    however fast or slow the machine. Returns the topology and the gate."""
    toml = wordcount_toml(tmp_path, corpus, count_cmd)
    gate = tmp_path / "gate"
    spout = [str(Path(__file__).parent / "components" / "gated_sentence_spout.py"), str(corpus), str(gate)]
    text = toml.read_text().replace(f'"{EXAMPLES / "python" / "sentence_spout.py"}", "{corpus}"',
                                    ", ".join(json.dumps(a) for a in spout))
    assert "gated_sentence_spout" in text
    toml.write_text(text)
    return toml, gate


def _wait(what: str, proc: subprocess.Popen, pred, timeout: float = 120):
    """Poll ``pred`` until it returns something true, while the run lives.
    A run that ends first, or is still short of it at the timeout (long:
    a deadline against a hang, on a machine however busy), fails
    the test with its stderr; one still running is killed (its group) first,
    so that nothing outlives the test."""
    deadline = time.monotonic() + timeout
    while not (got := pred()):
        if proc.poll() is not None or time.monotonic() > deadline:
            why = f"the run ended with {proc.returncode}" if proc.returncode is not None else f"not within {timeout} s"
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
            raise AssertionError(f"{what}: {why}; its stderr ends:\n{err[-4000:]}")
        time.sleep(0.02)
    return got


#: the processes a kill test kills (only this run's: its descendants), by their names and command lines: a
#: host worker's name is multilang-wN (forked by the fork server, its command line is the main process's)
VICTIMS = {"count": r"count_bolt", "split": r"split_bolt", "spout": r"sentence_spout",
           "worker-0": r"^multilang-w0 ", "worker-1": r"^multilang-w1 ", "fork-server": r"^multilang-fork "}


def _processes(run: subprocess.Popen, victim: str) -> list[int]:
    return [pid for pid in descendant_pids(run.pid)
            if running(pid) and re.search(VICTIMS[victim], f"{process_name(pid)} {cmdline(pid)}")]


def _signalled_after_the_first_checkpoint(run: subprocess.Popen, state: Path, victim: str,
                                         signum: int) -> tuple[int, str, str]:
    """Once the run has committed its first checkpoint, ``signum`` to a
    ``victim`` process (VICTIMS); then the run to its end: (pid, out, err)."""
    with _reaped(run):
        _wait("the first checkpoint", run, lambda: _committed_txid(state / "wordcount.sqlite") >= 1)
        pid = _wait(f"{victim} running", run, lambda: _processes(run, victim))[0]
        os.kill(pid, signum)
        out, err = run.communicate(timeout=180)
    return pid, out, err


@pytest.mark.parametrize("workers, victims", [
    (1, ["split", "count"]), (2, ["split", "count"]), (2, ["worker-1", "worker-0"]),
], ids=["1-worker-split-count", "2-workers-split-count", "2-workers-each-worker"])
def test_kill_9_mid_run_leaves_the_counts_exact_on_one_and_two_workers(tmp_path, corpus, workers, victims):
    """Issue 35: the kill tests with 1 worker (the embedded engine) and 2.
    A split process then a count process, or each host worker in turn (the spout's, worker 0, last) is SIGKILLed after the first
    checkpoint, each once the one before was replaced, while the run goes on
    (_wait checks that it does: the kills take a second or two of its
    several): every process comes
    back, the state rolls back to the last checkpoint, the trees since are
    replayed, and each word is counted once. With the workers killed the run
    is also recorded (--record): a worker started again goes on with its
    tasks' recordings, a session per process of each task."""
    path, expected = corpus
    toml = wordcount_toml(tmp_path, path, ["node", str(EXAMPLES / "node" / "count_bolt.js")])
    state, rec = tmp_path / "state", tmp_path / "rec"
    record = ["--record", str(rec)] if victims[0].startswith("worker") else []
    run = _run_cli(toml, state, "--workers", str(workers), *record)
    with _reaped(run):
        _wait("the first checkpoint", run, lambda: _committed_txid(state / "wordcount.sqlite") >= 1)
        if record:  # (a worker killed before its recorder's first write, within a second, leaves nothing of it)
            _wait("every task's first session written", run, lambda: len(
                {f.parent for f in rec.glob("*/task-*/seg-*.mlrec") if f.stat().st_size > 64}) == 5)
        for victim in victims:
            pids = _wait(f"{victim} running", run, lambda: _processes(run, victim))
            os.kill(pids[0], signal.SIGKILL)
            # replaced: as many running again, none of them the one killed
            _wait(f"{victim} {pids[0]} replaced", run,
                  lambda: len([p for p in _processes(run, victim) if p != pids[0]]) == len(pids))
        out, err = run.communicate(timeout=180)
    assert run.returncode == 0, err[-3000:]
    assert _counts(out) == expected
    # Said once per rollback, on any number of workers (each stateful worker said it too: twice on 2)
    rolled = re.search(r"committed \(\d+ in this run, (\d+) rolled back\)", err)
    assert rolled and err.count("state rolled back to checkpoint") == int(rolled[1]) >= 1, err[-3000:]
    if not victims[0].startswith("worker"):  # each says why: the process lost, on workers too (was: "a tree that
        # a stateful task took failed (owned by host worker 0)")
        lines = re.findall(r"state rolled back to checkpoint \d+[^:]*: (.*)", err)
        assert all(re.match(r"(split|count):\d+'s process was lost", ln) for ln in lines), lines
    # The summary's counters keep what the killed processes did (a killed worker's tasks' counts were
    # those of its last process only: split executed 5,850 of 11,100 sentences), and count their restarts.
    summary = {m[1]: {k: int(v) for k, v in re.findall(r"(\w+) (\d+)", m[2])}
               for m in re.finditer(r"^\[summary\]   (\w+): (.*)$", err, re.M)}
    sentences = len([ln for ln in path.read_text(encoding="utf-8").split("\n") if ln.strip(" \t\r\f\v")])
    trees = re.search(r"trees completed (\d+), failed (\d+)", err)  # (the one spout's trees: its counters)
    # Trees completed are counted by the checkpoints, exactly, whatever was killed.
    assert trees and [int(trees[1]), int(trees[2])] == [sentences, summary["sentences"]["failed"]], err[-2000:]
    # (a killed worker's counts are those of its last status, up to 50 ms old: what it did since is missing,
    # docs/WORKERS.md; the replays most often make up for that, and did not in 2 of about 20 loaded runs. A
    # spout's acked may fall short by up to max spout pending per death, as documented: 3,040 of 3,240 once)
    share = 0.9 if victims[0].startswith("worker") else 1.0
    assert share * sentences <= summary["sentences"]["acked"] <= sentences, summary
    assert summary["split"]["executed"] >= share * sentences, summary
    assert summary["count"]["executed"] >= share * sum(expected.values()), summary
    if record:  # one rollback per worker killed (a worker's request and the death's own made two)
        assert re.search(r"committed \(\d+ in this run, 2 rolled back\)", err), err[-2000:]
    killed = {"worker-0": ["sentences", "split", "count"], "worker-1": ["split", "count"]}
    for comp in {c for v in victims for c in killed.get(v, [v])}:
        assert summary[comp]["restarts"] >= 1, (comp, summary)
    if record:
        assert f"[record] frames of 5 task(s) (sentences, split, count) recorded in {rec}" in err, err[-2000:]
        for comp in ("sentences", "split", "count"):
            for task in (rec / comp).iterdir():
                log = read_task(str(task))
                numbers = sorted(log.sessions)
                assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 2, (task, numbers)
                assert all(s.complete for s in log.sessions.values()) and not log.notes, (task, log.notes)


def _word_count_on_two_workers(tmp_path: Path, corpus: tuple[Path, dict[str, int]],
                               *args: str) -> tuple[subprocess.Popen, Path, dict[str, int]]:
    """The README's word count (the Node count) over ``corpus`` on 2 host
    workers with ``args``, once it has committed its first checkpoint:
    (the run, its state dir, the counts expected)."""
    path, expected = corpus
    toml = wordcount_toml(tmp_path, path, ["node", str(EXAMPLES / "node" / "count_bolt.js")])
    state = tmp_path / "state"
    run = _run_cli(toml, state, "--workers", "2", *args)
    _wait("the first checkpoint", run, lambda: _committed_txid(state / "wordcount.sqlite") >= 1)
    return run, state, expected


def test_a_count_process_lost_on_the_other_worker_is_named_as_the_rollbacks_cause(tmp_path, corpus):
    """The count process of worker 1 (its trees are worker 0's, whose
    spout began them) is SIGKILLed: the rollback says why, as on one
    worker ("count:N's process was lost: ..."). A trial saw "a tree that a
    stateful task took failed (owned by host worker 0)": the failure reached
    worker 1 back from the tree's owner without its cause."""
    run, _, expected = _word_count_on_two_workers(tmp_path, corpus)
    with _reaped(run):
        worker = _wait("worker-1 running", run, lambda: _processes(run, "worker-1"))[0]
        pid = _wait("its count process", run, lambda: [p for p in descendant_pids(worker)
                                                       if running(p) and re.search(VICTIMS["count"], cmdline(p))])[0]
        os.kill(pid, signal.SIGKILL)
        out, err = run.communicate(timeout=180)
    assert run.returncode == 0, err[-3000:]
    assert _counts(out) == expected
    lines = re.findall(r"state rolled back to checkpoint \d+ on every host worker: (.*)", err)
    # (killed while a checkpoint was being taken, its rollback says that instead)
    assert lines and all(re.match(rf"count:\d+'s process was lost: .*\(pid {pid}\)|a checkpoint was abandoned: a "
                                  "stateful process was lost while it was taken", ln) for ln in lines), lines


@pytest.mark.parametrize("signum, kill_a_worker", [(signal.SIGKILL, True), (signal.SIGSTOP, True),
                                                   (signal.SIGSTOP, False)],
                         ids=["server-killed", "server-stopped", "server-stopped-no-worker-dies"])
def test_the_fork_server_killed_or_stopped_the_workers_run_on_and_one_that_dies_starts_afresh(tmp_path, corpus,
                                                                                              signum, kill_a_worker):
    """The fork server (multilang-fork, the workers' parent) is SIGKILLed or
    SIGSTOPped after the first checkpoint, then (or not) worker 1 is
    SIGKILLed. The workers it forked run on; worker 1's death is seen by its
    pidfd, its status not reported; it starts again as a new interpreter
    (a stopped server, which does not answer the fork, is killed); every word
    is counted once, and the run ends. A trial's run with a stopped server
    never ended, signals or not: the main process learnt of a worker's end
    only from the server."""
    run, _, expected = _word_count_on_two_workers(tmp_path, corpus)
    with _reaped(run):
        # (found first: with their parent gone they are no descendants of the run's process)
        server = _wait("the fork server running", run, lambda: _processes(run, "fork-server"))[0]
        worker = _wait("worker-1 running", run, lambda: _processes(run, "worker-1"))[0]
        os.kill(server, signum)
        if kill_a_worker:
            os.kill(worker, signal.SIGKILL)
            _wait("worker-1 started again", run, lambda: [p for p in _processes(run, "worker-1") if p != worker])
        out, err = run.communicate(timeout=180)
    assert run.returncode == 0, err[-3000:]
    assert _counts(out) == expected
    if kill_a_worker:
        assert f"host worker 1 (pid {worker}) died (its exit status not reported by its fork server); restarted" \
            in err, err[-3000:]
        why = f"the fork server (pid {server}) " + ("is gone" if signum == signal.SIGKILL else
                                                      "did not answer within 3s: killed")
        assert f"host worker 1 starts as a new interpreter: {why}" in err, err[-3000:]
    else:
        assert "host worker" not in err, err[-3000:]


@pytest.mark.parametrize("when", ["while-the-run-goes-on", "as-the-run-ends"])
def test_a_dead_workers_stopped_component_is_ended_by_the_main_process_and_its_folders_removed(tmp_path, corpus,
                                                                                              when):
    """Worker 1's count process is stopped (SIGSTOP: it reads no end of its
    input, as a hung one does not), then worker 1 is SIGKILLed. The main
    process ends what the dead worker ran as the host ends a process (the
    kill grace, SIGTERM, the grace, SIGKILL to its group) while the run goes
    on (--duration: stopped by a signal after that), or at once as the run
    ends (to the end: the counts stay exact). A trial's stopped or hung
    component outlived the run (parent pid 1), and the dead worker's pid
    folder stayed in the temporary directory."""
    path, expected = corpus
    toml = wordcount_toml(tmp_path, path, ["node", str(EXAMPLES / "node" / "count_bolt.js")])
    state, tmp = tmp_path / "state", tmp_path / "tmp"
    tmp.mkdir()
    going_on = when == "while-the-run-goes-on"
    run = _run_cli(toml, state, "--workers", "2", "-c", "multilang.kill.grace.secs=0.3",
                   *(["--duration", "600"] if going_on else []), tmp=tmp)
    lines: list[str] = []
    with _reaped(run):
        _wait("the first checkpoint", run, lambda: _committed_txid(state / "wordcount.sqlite") >= 1)
        worker = _wait("worker-1 running", run, lambda: _processes(run, "worker-1"))[0]
        count = _wait("its count process", run, lambda: [p for p in descendant_pids(worker)
                                                         if running(p) and re.search(VICTIMS["count"], cmdline(p))])[0]
        seen = Seen([count])
        os.kill(count, signal.SIGSTOP)
        os.kill(worker, signal.SIGKILL)
        if going_on:
            _stderr_until(run, lines, f"host worker 1 died: 1 of its component processes (pid {count}) still ran "
                                      "after SIGTERM: SIGKILL")
            _wait("the count process gone", run, lambda: not seen.running())
            run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=180)
    err = "".join(lines) + err
    assert run.returncode == (143 if going_on else 0), err[-3000:]
    if not going_on:
        assert _counts(out) == expected
    assert not seen.running(), f"count process {count} outlived the run:\n{err[-3000:]}"
    assert not _scratch_of([worker], [tmp]), err[-3000:]  # (its pid folder: no finally of its ran)


def _with_python_split(tmp_path: Path, corpus: Path, split: Path) -> Path:
    """The README's word count over ``corpus`` with the Python ``split``
    script in place of the Ruby split (held emits, as the README's)."""
    toml = wordcount_toml(tmp_path, corpus, ["node", str(EXAMPLES / "node" / "count_bolt.js")])
    ruby = f'["ruby", "{EXAMPLES / "ruby" / "split_bolt.rb"}"]'
    assert ruby in toml.read_text()
    toml.write_text(toml.read_text().replace(ruby, json.dumps(["python", str(split)])))
    return toml


def _gated_split_toml(tmp_path: Path, corpus: Path, gate: Path) -> Path:
    """The README's word count with a Python split (held emits, as the
    README's) that, while ``gate`` exists, keeps each sentence unacked after
    emitting its words, and says so in ``gate``.PID."""
    split = tmp_path / "gated_split.py"
    split.write_text(textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(EXAMPLES / "python")!r})
        from split_bolt import words
        from multilang import BasicBolt

        GATE = {str(gate)!r}

        class GatedSplit(BasicBolt):
            def process(self, tup):
                for w in words(tup.values[0]):
                    self.emit([w])
                if os.path.exists(GATE):
                    open(f"{{GATE}}.{{os.getpid()}}", "w").close()
                    while os.path.exists(GATE):
                        time.sleep(0.005)

        GatedSplit().run()
    """))
    return _with_python_split(tmp_path, corpus, split)


def test_a_sentence_acked_on_a_worker_that_rolled_back_first_is_replayed_not_lost(tmp_path):
    """Worker 1 rolls back before worker 0, whose spout began the trees (each
    hears the main process's rollback on its own connection): worker 1's
    split acks a sentence of the old epoch, and drops the words it held
    for it (their tree was rolled back). That ack reached worker 0 ahead of
    the rollback, completed the tree without its words, and the sentence
    was never replayed: CI counted 117 of 120 for most words. Worker 0 is
    stopped (SIGSTOP) while the rollback reaches worker 1 and the ack is
    sent, and goes on with both waiting (which it read first was trio's
    pick: the old code lost words in 7 runs of 7), three times; the counts
    must be exact."""
    text = (EXAMPLES / "data" / "alice.txt").read_text(encoding="utf-8") * 6  # (enough for the three)
    path = tmp_path / "alice6.txt"
    path.write_text(text, encoding="utf-8")
    gate = tmp_path / "gate"
    toml = _gated_split_toml(tmp_path, path, gate)
    state = tmp_path / "state"
    run = _run_cli(toml, state, "--workers", "2")
    seen: list[str] = []
    killed = 0
    with _reaped(run):
        _wait("the first checkpoint", run, lambda: _committed_txid(state / "wordcount.sqlite") >= 1)
        for _ in range(3):
            zero, one = (_wait(f"worker-{w} running", run, lambda: _processes(run, f"worker-{w}"))[0] for w in "01")
            split, count = (_wait(f"worker 1's {name}", run, lambda: [
                p for p in descendant_pids(one) if running(p) and name in cmdline(p) and p != killed])[0]
                for name in ("gated_split", "count_bolt"))
            gate.touch()
            _wait("worker 1's split holding a sentence", run, lambda: Path(f"{gate}.{split}").exists())
            os.kill(zero, signal.SIGSTOP)
            try:
                os.kill(count, signal.SIGKILL)
                killed = count
                _stderr_until(run, seen, "on every host worker")
                gate.unlink()
                Path(f"{gate}.{split}").unlink()
                time.sleep(0.2)  # (the split's ack on its way to worker 0: a test that waits less can only pass)
            finally:
                os.kill(zero, signal.SIGCONT)
        out, err = run.communicate(timeout=180)
    err = "".join(seen) + err
    assert run.returncode == 0, err[-3000:]
    assert len(re.findall("state rolled back to checkpoint", err)) >= 3, err[-3000:]
    assert _counts(out) == plain_count(text)


def test_a_hung_worker_is_killed_and_restarted_and_the_counts_stay_exact(tmp_path, corpus):
    """Storm's supervisor.worker.timeout.secs: a host worker stopped
    (SIGSTOP: hung, answering nothing) after the first checkpoint is killed
    once it has said nothing for that long, and started again; the run goes
    on and each word is counted once, with no tree timing out. A trial's run
    stalled for good, and a SIGTERM did not end it (the main process waited
    for the hung worker's result)."""
    path, expected = corpus
    toml = wordcount_toml(tmp_path, path, ["node", str(EXAMPLES / "node" / "count_bolt.js")])
    state = tmp_path / "state"
    run = _run_cli(toml, state, "--workers", "2", "-c", "supervisor.worker.timeout.secs=2")
    pid, out, err = _signalled_after_the_first_checkpoint(run, state, "worker-1", signal.SIGSTOP)
    assert run.returncode == 0, err[-3000:]
    assert re.search(rf"host worker 1 \(pid {pid}\) has said nothing for [\d.]+s, past "
                     r"supervisor.worker.timeout.secs \(2s\): killed", err), err[-3000:]
    # No tree waited for its message timeout (30 s): a checkpoint begun while the worker was starting
    # again waited for its cut, which it never heard of, until the trees timed out.
    assert "(timed out 0)" in err, err[-3000:]
    assert _counts(out) == expected


def test_a_worker_hung_past_the_message_timeout_again_and_again_leaves_the_counts_exact(tmp_path, corpus):
    """Worker 1 (a split and a count task; the spout is worker 0's) is
    stopped (SIGSTOP) for longer than the message timeout, 1 s here, six
    times. Worker 0's trees time out and replay, but not those a checkpoint
    committed whose last acks, released by the commit, were still on worker
    1's side: they complete at their deadline. Before, they failed, and
    their spout replayed them: counted twice (a window of max spout pending,
    200 sentences, in most such runs). Nor does a tree time out between its
    worker's cut and the commit of that checkpoint (the other workers
    prepare without its failure)."""
    run, _, expected = _word_count_on_two_workers(tmp_path, corpus, "-c", "topology.message.timeout.secs=1")
    with _reaped(run):
        pid = _wait("worker-1 running", run, lambda: _processes(run, "worker-1"))[0]
        for _ in range(6):
            if run.poll() is not None:
                break
            os.kill(pid, signal.SIGSTOP)
            time.sleep(1.6)  # (the fault itself: hung past the message timeout)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.2)
        out, err = run.communicate(timeout=180)
    assert run.returncode == 0, err[-3000:]
    assert _counts(out) == expected
    timed_out = re.search(r"\(timed out (\d+)\)", err)
    assert timed_out and int(timed_out[1]) > 0, err[-3000:]  # (the trees did time out: the fault happened)


@pytest.mark.parametrize("hung, again", [([1], False), ([0, 1], False), ([1], True)],
                         ids=["worker-1", "every-worker", "worker-1-second-signal"])
def test_a_worker_hung_when_the_run_stops_is_killed_and_the_others_end_with_what_they_did(tmp_path, corpus, hung,
                                                                                          again):
    """A host worker hangs (SIGSTOP) and the run is told to stop (SIGTERM):
    once the shutdown grace is over and the workers are told to end, the
    hung one is killed when silent for 10 s (not supervisor.worker.timeout.secs,
    30 s: a trial's first signal waited that long) and not started again,
    and the others end with their counts. A trial's run waited 10 s for the
    dead worker's last status, took the healthy worker's silence meanwhile
    for a hang and killed it too, and printed a summary of zeros (exit 0).
    The state stays exact: a run resumed from its state dir counts every
    word once. With every worker hung, no worker's result comes: the
    summary still says which bolts are stateful and what was committed (a
    trial's said that no bolt had accepted the state extension). A second
    signal (stop at once) kills the hung one after 2 s of silence, not 10."""
    path, expected = corpus
    toml = wordcount_toml(tmp_path, path, ["node", str(EXAMPLES / "node" / "count_bolt.js")])
    state = tmp_path / "state"
    # (with the live view: its last frame waits for every worker's status)
    # (10 s: on a loaded machine the healthy worker still answers well within it; its kill is what is checked.
    # With no healthy worker, 3 s: supervisor.worker.timeout.secs, where shorter, is the limit then too.)
    sooner = ["-c", "supervisor.worker.timeout.secs=3"] if 0 in hung else []
    run = _run_cli(toml, state, "--workers", "2", "-c", "multilang.shutdown.grace.secs=1", "--progress", *sooner)
    with _reaped(run):
        _wait("the first checkpoint", run, lambda: _committed_txid(state / "wordcount.sqlite") >= 1)
        pids = {w: _wait(f"worker-{w} running", run, lambda: _processes(run, f"worker-{w}"))[0] for w in hung}
        for pid in pids.values():
            os.kill(pid, signal.SIGSTOP)
        run.send_signal(signal.SIGTERM)
        if again:
            run.send_signal(signal.SIGINT)  # (another signal: a second SIGTERM sent at once may merge with it)
        _, err = run.communicate(timeout=180)
    # (the first signal taken names the exit: SIGTERM's 143, or SIGINT's 130 where both were pending at once)
    assert run.returncode in ((130, 143) if again else (143,)), err[-3000:]
    assert ("stopping at once" in err) == again, err[-3000:]
    allowed = ("the 2s allowed as the run stops at once" if again else
               r"supervisor.worker.timeout.secs \(3s\)" if sooner else "the 10s allowed while the run ends")
    for w, pid in pids.items():
        assert re.search(rf"host worker {w} \(pid {pid}\) has said nothing for [\d.]+s, past {allowed}: killed",
                         err), err[-3000:]
        assert f"host worker {w} (pid {pid}) died (killed by SIGKILL) while the run stopped: not started again" \
            in err, err[-3000:]
    if 0 not in hung:
        # (after a second signal a worker silent for 2 s is killed: on a loaded machine that may be a slow one)
        assert again or "host worker 0" not in err, err[-3000:]
        sentences = re.search(r"^\[summary\]   sentences: emitted (\d+), acked (\d+)", err, re.M)
        assert sentences and int(sentences[2]) > 0, err[-3000:]
    assert re.search(r"^\[summary\] state of count: checkpoint \d+ committed", err, re.M), err[-3000:]
    resumed = _run_cli(toml, state)
    out, err = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, err[-3000:]
    assert _counts(out) == expected


def _max_tuples_reference(tmp_path: Path, corpus, limit: int = 2500) -> tuple[Path, dict[str, int], str]:
    """The word count with a checkpoint per 10 sentences (max spout pending
    10: a run long enough for a kill to fall mid-run), and what its
    --max-tuples run counts without a kill: the words of the corpus's first
    ``limit`` sentences (the spout emits them in order)."""
    path, _ = corpus
    toml = wordcount_toml(tmp_path, path, ["node", str(EXAMPLES / "node" / "count_bolt.js")])
    toml.write_text(toml.read_text().replace('"topology.max.spout.pending" = 200', '"topology.max.spout.pending" = 10'))
    sentences = [ln for ln in path.read_text(encoding="utf-8").split("\n") if ln.strip(" \t\r\f\v")]
    assert len(sentences) > limit
    return toml, plain_count("\n".join(sentences[:limit])), str(limit)


def test_max_tuples_with_the_spouts_worker_killed_counts_what_one_worker_counts(tmp_path, corpus):
    """--max-tuples on 2 workers, the spout's worker (0) SIGKILLed after the
    first checkpoint: its next process may emit the limit less the trees its
    predecessor completed (the checkpoints say how many; the trees in flight
    were failed, and its spout replays them), so the run counts exactly the
    corpus's first sentences, as the embedded engine's --max-tuples run does."""
    toml, expected, limit = _max_tuples_reference(tmp_path, corpus)
    state = tmp_path / "state"
    run = _run_cli(toml, state, "--workers", "2", "--max-tuples", limit)
    _, out, err = _signalled_after_the_first_checkpoint(run, state, "worker-0", signal.SIGKILL)
    assert run.returncode == 0, err[-3000:]
    assert "host worker 0" in err and "died (killed by SIGKILL)" in err, err[-2000:]
    assert _counts(out) == expected


@pytest.mark.parametrize("workers", [1, 2])
def test_max_tuples_holds_through_a_rollback_on_one_and_two_workers(tmp_path, corpus, workers):
    """--max-tuples with a count process SIGKILLed after the first
    checkpoint: the state rolls back, the spout is told of the failed
    trees and still gets `next` past the limit to replay them. The
    sentence spout queues its replays behind its fresh lines, so it emitted
    those first: a trial's run went on to the end of its input (21,600
    trees for --max-tuples 5000), exit 0. Past the limit only replays are
    delivered: the run counts what the run without a kill counts."""
    toml, expected, limit = _max_tuples_reference(tmp_path, corpus)
    state = tmp_path / "state"
    run = _run_cli(toml, state, "--workers", str(workers), "--max-tuples", limit)
    _, out, err = _signalled_after_the_first_checkpoint(run, state, "count", signal.SIGKILL)
    assert run.returncode == 0, err[-3000:]
    assert "state rolled back to" in err, err[-2000:]  # (the kill fell before the last trees were done)
    assert f"trees completed {limit}," in err, err[-2000:]
    assert _counts(out) == expected


@pytest.mark.parametrize("workers", [1, 2])
def test_max_tuples_counts_a_failed_input_once_when_the_spout_restarts_before_replaying_it(tmp_path, corpus,
                                                                                           workers):
    """A split process SIGKILLed while it holds a sentence (its trees in
    flight fail: the spout queues them behind its other lines), then the
    spout's process, before it replayed them: its next process reads its
    input from the start and emits the failed lines again among the rest.
    Those are replays, not fresh inputs: counted against --max-tuples they
    took the place of as many new sentences (a trial of --max-tuples 5600
    under random kills committed 5,400 or 5,200 inputs, 6 runs of 20). The
    split holds its sentence until the gate is gone, so both kills fall
    before the limit, however fast the machine."""
    path, _ = corpus
    gate = tmp_path / "gate"
    gate.touch()
    toml = _gated_split_toml(tmp_path, path, gate)
    sentences = [ln for ln in path.read_text(encoding="utf-8").split("\n") if ln.strip(" \t\r\f\v")]
    limit = 2500
    state = tmp_path / "state"
    run = _run_cli(toml, state, "--workers", str(workers), "--max-tuples", str(limit))
    with _reaped(run):
        held = _wait("a split holding a sentence", run, lambda: list(tmp_path.glob("gate.*")))[0]
        split = int(held.name.split(".")[1])
        os.kill(split, signal.SIGKILL)
        spout = _wait("the spout running", run, lambda: _processes(run, "spout"))[0]
        os.kill(spout, signal.SIGKILL)
        _wait(f"the spout {spout} replaced", run, lambda: [p for p in _processes(run, "spout") if p != spout])
        gate.unlink()
        out, err = run.communicate(timeout=180)
    assert run.returncode == 0, err[-3000:]
    failed = re.search(r"sentences: emitted \d+, acked \d+, failed (\d+)", err)
    assert failed and int(failed.group(1)) > 0, "no tree failed (nothing to replay):\n" + err[-2000:]
    assert f"trees completed {limit}," in err, err[-2000:]
    assert _counts(out) == plain_count("\n".join(sentences[:limit]))


@pytest.mark.parametrize("workers, stop", [(2, "duration"), (2, "SIGTERM")])
def test_a_run_stopped_midway_and_run_again_counts_each_word_once(tmp_path, corpus, workers, stop):
    """A run on 2 workers stopped by --duration or by SIGTERM drains its trees and takes
    its last checkpoint within the shutdown grace (one worker's is in
    test_stateful_edges.py; on workers: every worker
    drains before any ends, and a checkpoint is of every worker or of none);
    the same command run again resumes and ends with each word counted once."""
    path, expected = corpus
    toml = wordcount_toml(tmp_path, path, ["node", str(EXAMPLES / "node" / "count_bolt.js")])
    state = tmp_path / "state"
    first = _run_cli(toml, state, "--workers", str(workers), *(["--duration", "1"] if stop == "duration" else []))
    if stop == "SIGTERM":
        _wait("the first checkpoint", first, lambda: _committed_txid(state / "wordcount.sqlite") >= 1)
        started = Seen(descendant_pids(first.pid))
        first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=120)
    if stop == "SIGTERM":
        assert first.returncode == 143 and "interrupted by SIGTERM" in err, err[-2000:]
        assert not started.running(), "a process outlived the stop"
    else:
        assert first.returncode == 0, err[-2000:]
    # (the trees in flight drain and their checkpoint is taken within the grace; on a loaded machine a window
    # of them may be abandoned at stop instead: the resume replays those, and the counts are exact all the same)
    again = _run_cli(toml, state, "--workers", str(workers))
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err[-2000:]
    assert _counts(out) == expected


@pytest.mark.parametrize("count_cmd, workers", [
    *[pytest.param(p.values[0], 1, id=f"{k}-1-worker", marks=p.marks) for k, p in COUNT_BOLTS.items()],
    pytest.param(COUNT_BOLTS["node"].values[0], 2, id="node-2-workers", marks=COUNT_BOLTS["node"].marks)])
def test_a_killed_host_resumes_from_its_state_dir_with_exact_counts(tmp_path, request, corpus, count_cmd, workers):
    path, expected = corpus
    # The spout holds at half its input until the gate exists: the first run is
    # killed mid-run whatever the machine's pace (a fast run used to end first).
    toml, gate = _gated(tmp_path, path, count_cmd)
    state = tmp_path / "state"
    # --duration: a run to the end would end once the spout, held at the gate,
    # and every tree are idle, which on a busy machine can come before the
    # first checkpoint; this run must still be running when it is killed.
    # The runs' temporary directory, where a killed run leaves its scratch folders: short enough to hold
    # the workers' sockets, and in no folder that another run sweeps (any run removes what a dead run
    # left in its TMPDIR and in /tmp: under xdist one may start in the instant between the kill and the
    # check below).
    scratch = Path(tempfile.mkdtemp(prefix="ml-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(scratch, ignore_errors=True))
    first = _run_cli(toml, state, "--duration", "600", "--workers", str(workers), tmp=scratch)
    db = state / "wordcount.sqlite"
    _wait("the first checkpoint (200 ms apart)", first, lambda: _committed_txid(db) >= 1)
    started = Seen(descendant_pids(first.pid))
    os.killpg(first.pid, signal.SIGKILL)  # the host and every process of its group
    first.communicate()
    assert first.returncode == -signal.SIGKILL
    # Host workers run in sessions of their own: they see the main process go and stop, with their components.
    deadline = time.monotonic() + 20
    while started.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [(p, cmdline(p)) for p in started.running()], "left running after the host was killed"
    # No finally ran in the killed process: its pid folder (one worker) or the workers' folder is left ...
    left = _scratch_of([first.pid, *started], [scratch])
    assert [p.name.rsplit("-", 1)[0] for p in left] == ["multilang-pids" if workers == 1 else "multilang-workers"]
    gate.touch()

    second = _run_cli(toml, state, "--workers", str(workers), tmp=scratch)
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert not [p for p in left if p.exists()] and list(scratch.iterdir()) == []  # ... the next run removed it
    assert _counts(out) == expected
    sentences = next(ln for ln in err.splitlines() if ln.startswith("[summary]   sentences:"))
    skipped = int(sentences.rsplit("skipped (already committed, or in flight from a process that died) ", 1)[1])
    assert 0 < skipped < len(expected) * 10, sentences
    assert "state of count: checkpoint" in err and str(db) in err


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_state_dir_of_another_parallelism_is_refused(tmp_path, corpus, workers):
    """Named with the topology's file on workers too (a trial: the file was left out there)."""
    path, _ = corpus
    toml = wordcount_toml(tmp_path, path, ["python", str(EXAMPLES / "python" / "count_bolt.py")])
    state = tmp_path / "state"
    r = subprocess.run([*ML, "run", str(toml), "--state-dir", str(state), "--max-tuples", "50", "--no-progress"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "state of count: checkpoint" in r.stderr, r.stderr
    toml.write_text(toml.read_text().replace('fields = ["word", "count"]\nparallelism = 2',
                                             'fields = ["word", "count"]\nparallelism = 3'))
    r = subprocess.run([*ML, "run", str(toml), "--state-dir", str(state), "--no-progress", "--workers", workers],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"error: {toml}: state store {state / 'wordcount.sqlite'}: component 'count' has state "
                               "for 2 task(s), but this topology runs 3"), r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_two_runs_cannot_share_a_state_dir(tmp_path, corpus, workers):
    """The second is refused, named with its file, on workers too (a trial: there the file was left
    out, and the refusal took 5 s, where STATE.md says up to 2 s)."""
    path, _ = corpus
    toml = wordcount_toml(tmp_path, path, ["python", str(EXAMPLES / "python" / "count_bolt.py")])
    state = tmp_path / "state"
    first = _run_cli(toml, state, "--duration", "100")  # holds the store until killed
    try:
        deadline = time.monotonic() + 60
        while _committed_txid(state / "wordcount.sqlite") < 1:
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        r = subprocess.run([*ML, "run", str(toml), "--state-dir", str(state), "--no-progress", "--workers", workers],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert f"error: {toml}: state store {state / 'wordcount.sqlite'}: another run is using it" in r.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()



def _slow_split_toml(tmp_path: Path, corpus: Path) -> Path:
    """The README's word count with a Python split that takes 20 ms a
    sentence: a stop's drain of max spout pending (200) sentences lasts
    seconds, whatever the machine."""
    split = tmp_path / "slow_split.py"
    split.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(EXAMPLES / "python")!r})
        from split_bolt import words
        from multilang import BasicBolt

        class SlowSplit(BasicBolt):
            def process(self, tup):
                time.sleep(0.02)
                for w in words(tup.values[0]):
                    self.emit([w])

        SlowSplit().run()
    """))
    return _with_python_split(tmp_path, corpus, split)


def _stderr_until(run: subprocess.Popen, seen: list[str], text: str) -> None:
    """The run's stderr read (into ``seen``) up to a line with ``text``."""
    assert run.stderr is not None
    for line in run.stderr:
        seen.append(line)
        if text in line:
            return
    raise AssertionError(f"the run never said {text!r}: " + "".join(seen)[-3000:])


def _stopping(run: subprocess.Popen, seen: list[str]) -> None:
    """SIGINT to the run, and its stderr read up to the line that says it stops."""
    run.send_signal(signal.SIGINT)
    _stderr_until(run, seen, "SIGINT: stopping (")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_second_signal_while_the_trees_drain_prints_every_count_so_far(tmp_path, corpus, workers):
    """Stopped at once by a second SIGINT while a stop drains: the output is
    the last count per word so far, committed or not, so its counts add up
    to the words the count bolt counted (its emits, in the summary), and the
    metrics file's last line holds the summary's counts. On 2 workers a
    trial's run printed only what the last checkpoint had committed (4,767
    words of 6,503), and the metrics file's one line was the zeros of
    before the start."""
    path, _ = corpus
    toml = _slow_split_toml(tmp_path, path)
    state, metrics = tmp_path / "state", tmp_path / "metrics.jsonl"
    run = _run_cli(toml, state, "--workers", workers, "--metrics-file", str(metrics))
    seen: list[str] = []
    with _reaped(run):
        _wait("the first checkpoint", run, lambda: _committed_txid(state / "wordcount.sqlite") >= 1)
        _stopping(run, seen)
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=180)
    err = "".join(seen) + err
    assert run.returncode == 130, err[-3000:]
    assert "SIGINT: stopping at once" in err, err[-3000:]
    emitted = re.search(r"^\[summary\]   count: emitted (\d+), executed", err, re.M)
    assert emitted, err[-3000:]
    assert sum(_counts(out).values()) == int(emitted[1]), err[-3000:]
    last = json.loads(metrics.read_text().splitlines()[-1])
    assert last["components"]["count"]["emitted"] == int(emitted[1]), (last["components"], err[-3000:])


def test_the_spouts_worker_killed_while_the_run_stops_keeps_its_protocol_line(tmp_path, corpus):
    """The spout's worker (0) killed while a stop drains: the summary says
    what its spout's process negotiated as of its last status, as for a
    worker killed mid-run (a trial's said "sentences standard")."""
    path, _ = corpus
    toml = _slow_split_toml(tmp_path, path)
    state = tmp_path / "state"
    run = _run_cli(toml, state, "--workers", "2", "--log-level", "debug")
    seen: list[str] = []
    with _reaped(run):
        _wait("the first checkpoint", run, lambda: _committed_txid(state / "wordcount.sqlite") >= 1)
        pid = _processes(run, "worker-0")[0]
        _stopping(run, seen)
        _stderr_until(run, seen, "the run stops (signal)")  # (taken in: a death is not restarted from now)
        os.kill(pid, signal.SIGKILL)
        out, err = run.communicate(timeout=180)
    err = "".join(seen) + err
    assert run.returncode == 130, err[-3000:]
    assert f"host worker 0 (pid {pid}) died (killed by SIGKILL) while the run stopped" in err, err[-3000:]
    assert "[summary] protocol: sentences batch; split batch; count batch+state" in err, err[-3000:]
