"""Record and replay (issue 23; docs/OBSERVE.md "Record and replay"), with real processes.

`multilang run --record DIR` taps every frame of every shell task;
`multilang replay DIR --component C --task N -- CMD` feeds one task's
recorded input to CMD and compares its output. Everything here synchronises
on process exits and on what the files hold; nothing asserts wall-clock time.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from multilang._cli.main import main as cli_main
from multilang.connection import Role
from multilang.shellbolt._replay.record import HOST, RecordingError, read_task
from multilang.shellbolt._replay.replay import plan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
_SCRIPT = Path(sys.executable).parent / "multilang"
ML = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-c", "from multilang._cli.entry import main; main()"]

needs_ruby_node = pytest.mark.skipif(
    shutil.which("ruby") is None or shutil.which("node") is None, reason="the word count needs ruby and node"
)


def ml(*args: str, cwd: Path = ROOT, timeout: float = 60) -> subprocess.CompletedProcess:
    r = subprocess.run(ML + list(args), cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def ml_here(*args: str):
    """The CLI in this process (usage errors: nothing is started)."""
    return CliRunner().invoke(cli_main, list(args))


def split_tasks(rec: Path) -> list[int]:
    meta = json.loads((rec / "recording.json").read_text())
    return meta["components"]["split"]["tasks"]


def busiest(rec: Path, component: str) -> int:
    """The task of ``component`` with the largest recording (shuffle may starve one)."""
    sizes = {int(d.name[5:]): sum(f.stat().st_size for f in d.iterdir()) for d in (rec / component).iterdir()}
    return max(sizes, key=sizes.get)


@pytest.fixture(scope="module")
def wordcount_recording(tmp_path_factory) -> Path:
    rec = tmp_path_factory.mktemp("rec") / "wc"
    r = ml("run", "examples/wordcount.toml", "--no-progress", "--max-tuples", "40", "--record", str(rec))
    assert r.returncode == 0, r.stderr
    assert f"recorded in {rec}" in r.stderr
    return rec


@needs_ruby_node
def test_recording_holds_every_task_and_the_run(wordcount_recording):
    rec = wordcount_recording
    meta = json.loads((rec / "recording.json").read_text())
    assert meta["format"] == "multilang-recording" and meta["version"] == 1
    assert meta["topology"] == "wordcount" and meta["started"] and meta["ended"]
    assert meta["components"]["split"]["command"] == ["ruby", "ruby/split_bolt.rb"]
    assert meta["components"]["split"]["cwd"] == str(EXAMPLES)
    for name, comp in meta["components"].items():
        assert sorted(int(d.name[5:]) for d in (rec / name).iterdir()) == comp["tasks"]
        for task in comp["tasks"]:
            log = read_task(str(rec / name / f"task-{task}"))
            assert [s.number for s in log.complete] == [1] and not log.notes
            s = log.sessions[1]
            assert s.start["argv"][1:] == comp["command"][1:] and s.ended  # reaped at the end of the run
            assert s.entries[0].kind == HOST and b'"pidDir"' in s.entries[0].data  # the handshake first
    assert oct((rec / "split").stat().st_mode & 0o777) == "0o700"


@needs_ruby_node
def test_replaying_the_split_bolt_against_the_same_command_reports_no_difference(wordcount_recording):
    rec = wordcount_recording
    task = busiest(rec, "split")
    r = ml("replay", str(rec), "--component", "split", "--task", str(task), "--", "ruby", "ruby/split_bolt.rb")
    assert r.returncode == 0, r.stdout + r.stderr
    words = r.stdout.strip()
    assert words.startswith("no difference: ") and words.endswith(" fails")
    counts = dict(reversed(part.split(" ")) for part in words[len("no difference: "):].split(", "))
    assert int(counts["tuples"]) > 0 and counts["acks"] == counts["tuples"] and counts["fails"] == "0"
    assert int(counts["emits"]) > int(counts["tuples"])  # sentences of several words
    # the same input, our Python split bolt (same words, msgpack-capable library): no difference either
    r = ml("replay", str(rec), "--component", "split", "--task", str(task), "--", "python", "python/split_bolt.py")
    assert r.returncode == 0 and r.stdout.strip() == words, r.stdout + r.stderr


@needs_ruby_node
@pytest.mark.parametrize("component, command", [
    ("count", ["node", "node/count_bolt.js"]),  # stateful, batch: its state frames (init, prepare, commit)
    ("sentences", ["python", "python/sentence_spout.py", "data/alice.txt"]),  # a spout: next, ack, under batch
])
def test_the_stateful_count_bolt_and_the_spout_replay_with_no_difference_and_the_recorded_offer(
        wordcount_recording, component, command):
    # The replay offered no extension (it passed the recorded conf, and a conf key is no offer, §9.1):
    # the count bolt then refused its state frames and the spout its batched commands (a trial).
    rec = wordcount_recording
    args = ["--task", str(busiest(rec, component))] if component == "count" else []
    r = ml("replay", str(rec), "--component", component, *args, "--", *command)
    assert r.returncode == 0 and r.stdout.startswith("no difference: "), r.stdout + r.stderr
    assert "accepted the extensions" not in r.stderr, r.stderr  # (the same offer, the same answer)
    if component == "sentences":
        assert r.stdout.strip().endswith(" commands, 40 emits"), r.stdout


@needs_ruby_node
def test_replaying_a_changed_split_bolt_names_the_first_difference(wordcount_recording, tmp_path):
    rec = wordcount_recording
    task = busiest(rec, "split")
    source = (EXAMPLES / "ruby" / "split_bolt.rb").read_text()
    upper = tmp_path / "split_upper.rb"
    upper.write_text(source.replace("tr('A-Z', 'a-z')", "tr('a-z', 'A-Z')")
                     .replace("require_relative 'multilang'", f"require_relative '{EXAMPLES / 'ruby' / 'multilang'}'"))
    r = ml("replay", str(rec), "--component", "split", "--task", str(task), "--", "ruby", str(upper))
    assert r.returncode == 1, r.stdout + r.stderr
    first = r.stdout.splitlines()
    assert first[0].startswith("first difference: tuple ") and " from sentences:" in first[0]
    expected, got = first[1], first[2]
    word = expected.split('emit ["')[1].split('"')[0]
    assert word == word.lower() and word != word.upper()
    assert f'got      emit ["{word.upper()}"] anchored to {first[0].split()[3]}' in got

    # One word fewer (the last of each sentence dropped): named too, at the event that is missing.
    drop = tmp_path / "split_drop.py"
    drop.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(EXAMPLES / "python")!r})
        from split_bolt import BasicBolt, words

        class Drop(BasicBolt):
            def process(self, tup):
                for w in list(words(tup.values[0]))[:-1]:
                    self.emit([w])

        Drop().run()
    """))
    r = ml("replay", str(rec), "--component", "split", "--task", str(task), "--", "python", str(drop))
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.startswith("first difference: tuple ")
    assert "got      ack" in r.stdout  # where the last word was expected, the ack came


@needs_ruby_node
def test_replay_usage_errors_exit_2(wordcount_recording, tmp_path):
    rec = str(wordcount_recording)
    split = ["--component", "split", "--task", str(split_tasks(wordcount_recording)[0])]
    cmd = ["--", "ruby", "ruby/split_bolt.rb"]
    cases = [
        ([str(tmp_path / "missing"), *split, *cmd], "no such directory"),
        ([str(tmp_path), *split, *cmd], "not a recording (no recording.json"),
        ([rec, "--component", "splitt", *cmd], "component 'splitt' is not in the recording"),
        ([rec, "--component", "split", *cmd], "ran 2 tasks"),
        ([rec, "--component", "split", "--task", "99", *cmd], "has no recorded task 99"),
        ([rec, *split, "--session", "7", *cmd], "session 7: no such session; complete sessions: 1"),
        ([rec, *split], "no command to replay into"),
        ([rec, *split, "--"], "no command to replay into"),
        ([rec, *split, "--", "nosuchprog123"], "error: command 'nosuchprog123' not found on PATH (the command runs in"),
        ([rec, *split, "--", "ruby", "ruby/nosuch.rb"], "error: script 'ruby/nosuch.rb' not found (commands run in"),
    ]
    for args, message in cases:
        r = ml_here("replay", *args)
        assert r.exit_code == 2, (args, r.output)
        assert message in r.output and "Traceback" not in r.output, (args, r.output)


def _topology(tmp_path: Path, bolt: list[str], conf: str = "", parallelism: int = 1) -> Path:
    toml = tmp_path / "topo.toml"
    toml.write_text(textwrap.dedent(f"""
        [topology]
        name = "rr"
        [topology.conf]
        {conf}
        [spouts.sentences]
        command = ["python", {str(EXAMPLES / "python" / "sentence_spout.py")!r}, {str(EXAMPLES / "data" / "alice.txt")!r}]
        fields = ["sentence"]
        [bolts.split]
        command = {json.dumps(bolt)}
        fields = ["word"]
        parallelism = {parallelism}
        inputs = [{{ source = "sentences", grouping = "shuffle" }}]
    """))
    return toml


@needs_ruby_node
def test_with_host_workers_each_records_its_own_tasks_and_a_task_replays(tmp_path):
    # --workers 2: the main process writes recording.json, each worker its own tasks' folders
    # (a task's folder has one writer); the recording reads and replays as one of the embedded engine.
    rec = tmp_path / "wc"
    r = ml("run", "examples/wordcount.toml", "--no-progress", "--workers", "2", "--record", str(rec), timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"[record] frames of 5 task(s) (sentences, split, count) recorded in {rec}" in r.stderr, r.stderr
    meta = json.loads((rec / "recording.json").read_text())
    assert meta["started"] and meta["ended"]
    for name, comp in meta["components"].items():
        assert sorted(int(d.name[5:]) for d in (rec / name).iterdir()) == comp["tasks"]
        for task in comp["tasks"]:
            log = read_task(str(rec / name / f"task-{task}"))
            assert [s.number for s in log.complete] == [1] and log.sessions[1].ended and not log.notes
    task = busiest(rec, "split")
    r = ml("replay", str(rec), "--component", "split", "--task", str(task), "--", "ruby", "ruby/split_bolt.rb")
    assert r.returncode == 0 and r.stdout.startswith("no difference: "), r.stdout + r.stderr


def test_record_usage_errors_exit_2(tmp_path):
    toml = _topology(tmp_path, ["python", str(EXAMPLES / "python" / "split_bolt.py")])
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("")
    (tmp_path / "afile").write_text("")
    for args, message in [
        (["--record", str(full)], "the directory is not empty; recordings are not mixed"),
        (["--record", str(tmp_path / "afile" / "rec")], "cannot create it"),
        (["--record", str(tmp_path / "afile")], "is a file"),
        (["--record", str(tmp_path / "r"), "--engine", "spark"], "--record applies to the embedded engine"),
    ]:
        r = ml_here("run", str(toml), "--no-progress", "--max-tuples", "1", *args)
        assert r.exit_code == 2, (args, r.output)
        assert message in r.output and "Traceback" not in r.output, (args, r.output)
    assert not (tmp_path / "r").exists()


def test_rotation_keeps_each_task_under_its_bound_and_says_what_was_lost(tmp_path):
    toml = _topology(tmp_path, ["python", str(EXAMPLES / "python" / "split_bolt.py")],
                     '"multilang.record.segment.bytes" = 4096\n"multilang.record.segments" = 3')
    rec = tmp_path / "rec"
    r = ml("run", str(toml), "--no-progress", "--max-tuples", "150", "--record", str(rec))
    assert r.returncode == 0, r.stderr
    for task_dir in [*(rec / "split").iterdir(), *(rec / "sentences").iterdir()]:
        segs = sorted(task_dir.iterdir())
        assert len(segs) <= 3
        assert sum(f.stat().st_size for f in segs) <= 3 * 4096
        assert all(f.stat().st_size <= 4096 for f in segs)
    segs = sorted((rec / "split" / "task-2").iterdir())
    assert segs[0].name != "seg-00000001.mlrec"  # it rotated: the oldest were deleted
    log = read_task(str(rec / "split" / "task-2"))
    assert any("rotated away" in n for n in log.notes)
    r = ml("replay", str(rec), "--component", "split", "--", "python", "python/split_bolt.py")
    assert r.returncode == 2 and "every session's start was rotated away" in r.stderr, r.stderr


def test_a_msgpack_session_replays(tmp_path):
    toml = _topology(tmp_path, ["python", str(EXAMPLES / "python" / "split_bolt.py")],
                     '"multilang.extensions" = ["batch", "msgpack"]')
    rec = tmp_path / "rec"
    r = ml("run", str(toml), "--no-progress", "--max-tuples", "30", "--record", str(rec))
    assert r.returncode == 0, r.stderr
    log = read_task(str(rec / "split" / "task-2"))
    p = plan(log.sessions[1], Role.BOLT)
    assert set(p.pid.extensions) == {"batch", "msgpack"}
    assert len(p.inputs) == 30 and p.recorded.acks == 30 and p.recorded.emits > 30
    assert not any(b"\nend\n" in e.data for e in log.sessions[1].entries[2:])  # binary frames after the pid reply
    r = ml("replay", str(rec), "--component", "split", "--", "python", str(EXAMPLES / "python" / "split_bolt.py"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith(f"no difference: 30 tuples, {p.recorded.emits} emits, 30 acks, 0 fails")


CRASH_ONCE = """
import os, sys
from multilang import BasicBolt

MARK = sys.argv[1]

class CrashOnce(BasicBolt):
    seen = 0

    def process(self, tup):
        CrashOnce.seen += 1
        if CrashOnce.seen == 5 and not os.path.exists(MARK):
            open(MARK, "w").close()
            os._exit(3)  # the 5th tuple of the first process
        for w in tup.values[0].split():
            self.emit([w])

CrashOnce().run()
"""


def test_a_restarted_process_starts_a_new_session(tmp_path):
    bolt = tmp_path / "crash_once.py"
    bolt.write_text(CRASH_ONCE)
    mark = tmp_path / "crashed"
    toml = _topology(tmp_path, ["python", str(bolt), str(mark)], '"topology.max.spout.pending" = 3')
    rec = tmp_path / "rec"
    r = ml("run", str(toml), "--no-progress", "--max-tuples", "20", "--record", str(rec))
    assert r.returncode == 0, r.stderr
    log = read_task(str(rec / "split" / "task-2"))
    assert [s.number for s in log.complete] == [1, 2]
    first, second = log.sessions[1], log.sessions[2]
    assert first.status == 3 and first.pid != second.pid
    p = plan(first, Role.BOLT)
    assert p.recorded.acks < 5 <= len(p.inputs)  # it died on its 5th tuple (acks of the 4 before may be unsent)

    cmd = ["--", "python", str(bolt), str(mark)]  # the mark exists now: no crash
    r = ml("replay", str(rec), "--component", "split", *cmd)  # the last session by default
    assert r.returncode == 0 and r.stdout.startswith("no difference: "), r.stdout + r.stderr
    assert "sessions 1, 2 can be replayed" in r.stderr and "replaying session 2" in r.stderr
    # session 1 against a bolt that does not crash: the tuples in flight at the crash were never
    # acked in the recording, so more output for them is no difference
    r = ml("replay", str(rec), "--component", "split", "--session", "1", *cmd)
    assert r.returncode == 0 and r.stdout.startswith("no difference: "), r.stdout + r.stderr
    # and against the bolt that crashes again: a clear message, exit 1
    mark.unlink()
    r = ml("replay", str(rec), "--component", "split", "--session", "1", *cmd)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.startswith("replay stopped: the command crashed during the replay; the last input sent: tuple ")
    assert "(the recorded process exited with status 3)" in r.stdout and "(exit status 3)" in r.stdout


@needs_ruby_node
def test_a_command_that_hangs_is_a_clear_failure(wordcount_recording):
    r = ml("replay", str(wordcount_recording), "--component", "sentences", "--timeout", "0.5", "--",
           "python", "-c", "import time; time.sleep(60)")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the command did not answer the handshake" in r.stdout and "0.5s handshake timeout" in r.stdout


def _wait_for(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def _sessions(task_dir: Path) -> list:
    try:
        return read_task(str(task_dir)).complete
    except RecordingError:  # nothing written yet
        return []


def test_replay_by_default_skips_a_last_session_that_took_no_tuple(tmp_path):
    """A bolt process killed after its work was done is restarted and takes
    nothing more: by default, replay picks the last session that took tuples
    (replaying the idle one would say "no difference: 0 tuples")."""
    data = tmp_path / "five.txt"
    data.write_text("a b\nc d\ne f\ng h\ni j\n")
    toml = tmp_path / "topo.toml"
    toml.write_text(textwrap.dedent(f"""
        [topology]
        name = "idle-last"
        [spouts.sentences]
        command = ["python", {str(EXAMPLES / "python" / "sentence_spout.py")!r}, {str(data)!r}]
        fields = ["sentence"]
        [bolts.split]
        command = ["python", {str(EXAMPLES / "python" / "split_bolt.py")!r}]
        fields = ["word"]
        inputs = [{{ source = "sentences", grouping = "shuffle" }}]
    """))
    rec = tmp_path / "rec"
    run = subprocess.Popen(ML + ["run", str(toml), "--no-progress", "--duration", "120", "--record", str(rec)],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        task_dir = rec / "split" / "task-2"
        _wait_for(lambda: len(_sessions(task_dir)) == 1 and plan(_sessions(task_dir)[0], Role.BOLT).recorded.acks == 5,
                  "the split bolt to ack the 5 sentences")
        os.kill(_sessions(task_dir)[0].pid, signal.SIGKILL)
        _wait_for(lambda: len(_sessions(task_dir)) == 2, "the restarted split process's handshake")
    finally:
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    second = _sessions(task_dir)[1]
    assert not plan(second, Role.BOLT).inputs

    r = ml("replay", str(rec), "--component", "split", "--", "python", str(EXAMPLES / "python" / "split_bolt.py"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("no difference: 5 tuples, 10 emits, 5 acks, 0 fails"), r.stdout + r.stderr
    assert "session 2 took no tuple; replaying the last one that did" in r.stderr
    assert "replaying session 1" in r.stderr
    # the idle session is still there to be chosen
    r = ml("replay", str(rec), "--component", "split", "--session", "2", "--",
           "python", str(EXAMPLES / "python" / "split_bolt.py"))
    assert r.returncode == 0 and r.stdout.startswith("no difference: 0 tuples"), r.stdout + r.stderr


@needs_ruby_node
def test_a_truncated_segment_is_an_error_naming_it_unless_partial(wordcount_recording, tmp_path):
    # Issue 32: a segment cut in half replayed as "no difference: 13 tuples" (25 were recorded), exit 0.
    rec = tmp_path / "rec"
    shutil.copytree(wordcount_recording, rec)
    task = busiest(rec, "split")
    (seg,) = sorted((rec / "split" / f"task-{task}").iterdir())
    full = seg.read_bytes()
    seg.write_bytes(full[: len(full) // 2])
    r = ml("replay", str(rec), "--component", "split", "--task", str(task), "--", "ruby", "ruby/split_bolt.rb")
    assert r.returncode == 1, r.stdout + r.stderr
    assert seg.name in r.stderr and "bytes are missing" in r.stderr and "--partial" in r.stderr, r.stderr
    assert "no difference" not in r.stdout
    r = ml("replay", str(rec), "--component", "split", "--task", str(task), "--partial", "--",
           "ruby", "ruby/split_bolt.rb")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("no difference: ") and f"{seg.name}: ends inside entry" in r.stderr
