"""`multilang run --engine spark` as a Structured Streaming query: an unbounded
spout stopped by --duration, a driver SIGKILLed and the same command run again
with --checkpoint, a Node count process SIGKILLed on the default master, and the
mistakes a user can make with the new flags. Real drivers (subprocesses with
their own SparkSession), real processes, real kills."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from multilang.errors import TopologyError

pytest.importorskip("pyspark")

#: on the standalone cluster's worker: one Spark JVM at a time there (tests/conftest.py)
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("cluster")]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
COMPONENTS = Path(__file__).parent / "components"
sys.path.insert(0, str(EXAMPLES / "python"))
from split_bolt import words  # noqa: E402

CLI = [sys.executable, "-c", "from multilang._cli.entry import main; main()"]
#: the CLI, refusing every POSIX call of its own (Python's audit events: open, listing, making, renaming,
#: removing, SQLite) on a path under argv[1]: a checkpoint location it must reach through its file system
#: layer only (adapters/spark/_engine/storage.py), as it would an object store
NO_POSIX_UNDER = [sys.executable, "-c", """
import sys
root = sys.argv.pop(1)
EVENTS = {"open", "os.listdir", "os.scandir", "os.mkdir", "os.rename", "os.remove", "os.rmdir", "shutil.rmtree",
          "sqlite3.connect", "os.chmod", "os.utime"}
def hook(event, args):
    if event in EVENTS and args and isinstance(args[0], (str, bytes)):
        path = args[0].decode() if isinstance(args[0], bytes) else args[0]
        if path.startswith(root):
            raise RuntimeError(f"the driver used POSIX on the checkpoint location: {event} {path}")
sys.addaudithook(hook)
from multilang._cli.entry import main
main()
"""]
ENV = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
SENTENCES = ["the cow jumped over the moon", "an apple a day keeps the doctor away",
             "four score and seven years ago", "snow white and the seven dwarfs", "i am at two with nature"]


def _plain_counts(lines: list[str]) -> list[dict]:
    counts = Counter(w for line in lines for w in words(line.strip()))
    return [{"word": w, "count": n} for w, n in sorted(counts.items())]


def _alice() -> list[str]:
    return (EXAMPLES / "data" / "alice.txt").read_text(encoding="utf-8").splitlines()


def _wordcount(tmp_path: Path, count_cmd: list[str] | None = None, spout: list[str] | None = None) -> Path:
    toml = tmp_path / "wc.toml"
    spout = spout or ["python", str(EXAMPLES / "python" / "sentence_spout.py"), str(EXAMPLES / "data" / "alice.txt")]
    count_cmd = count_cmd or ["node", str(EXAMPLES / "node" / "count_bolt.js")]
    toml.write_text(textwrap.dedent(f"""\
        [topology]
        name = "wc"
        [spouts.sentences]
        command = {orjson.dumps(spout).decode()}
        fields = ["sentence"]
        [bolts.split]
        command = ["ruby", "{EXAMPLES / 'ruby' / 'split_bolt.rb'}"]
        fields = ["word"]
        parallelism = 2
        inputs = [{{ source = "sentences", grouping = "shuffle" }}]
        [bolts.count]
        command = {orjson.dumps(count_cmd).decode()}
        fields = ["word", "count"]
        parallelism = 2
        inputs = [{{ source = "split", grouping = "fields", fields = ["word"] }}]
        [output]
        component = "count"
        key = ["word"]
    """))
    return toml


def _run(args: list[str], timeout: float = 240, env: dict[str, str] = ENV) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + ["run", "--engine", "spark", *args], capture_output=True, env=env, cwd=ROOT,
                          timeout=timeout)


def test_an_unbounded_spout_with_a_count_process_killed_stops_at_duration_with_exact_counts(tmp_path):
    """The spout never ends (sentence i = SENTENCES[i % 5], id i) and the count
    bolt (the README's Node StatefulBolt) SIGKILLs itself once mid-batch: the
    Spark task fails, the default master (local[*] runs as local[*,4])
    retries it with a fresh process that starts from the state before the
    batch. --duration stops the query after the batch running then commits:
    exit 0, a progress line per batch, and the counts are exactly those of
    the spout tuples the committed batches read: its first N."""
    marker = tmp_path / "crashed"
    toml = _wordcount(tmp_path, ["node", str(COMPONENTS / "engine_crash_once_count_bolt.js"), str(marker), "50"],
                      spout=["python", str(COMPONENTS / "engine_endless_spout.py"), "0.002"])
    tmp = tmp_path / "tmp"  # (the run's temporary directory: what it leaves there)
    tmp.mkdir()
    # (Two suite runs with the CPU loaded by two busy loops ended with no crash: with --duration 10, counted
    # from the query's start, and a crash after 300 words, either no batch had started by then or the first
    # was too small (a planning call waits at most 2 s for the spout) for a count process to see 300 words.
    # 20 s and 50 words leave room for both.)
    proc = _run([str(toml), "--duration", "20", "-c", "multilang.spark.max.tuples.per.trigger=400"],
                env={**ENV, "TMPDIR": str(tmp)})
    err = proc.stderr.decode()
    assert proc.returncode == 0, err[-3000:]
    # Spark kills its Python workers at the end (their pid folders stay): the next run of ours removes what
    # a dead process left, and nothing else may be left. (A worker may still be ending as the CLI exits: a
    # loaded CI run found its folder, its owner alive. Asked again until the owners are gone, up to a minute.)
    deadline = time.monotonic() + 60
    while True:
        subprocess.run([sys.executable, "-c", "import shutil; from multilang.shellbolt import scratch_folder; "
                        "shutil.rmtree(scratch_folder('multilang-pids-'))"], env={**ENV, "TMPDIR": str(tmp)},
                       check=True)
        left = sorted(p.name for p in tmp.iterdir() if p.name.startswith("multilang-"))
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left, f"the run left temporary folders that no later run removes: {left}"
    assert marker.exists(), f"the bolt never died: {err[-2000:]}"
    # (1: the crash; a loaded suite run once saw 2 with the counts checked below, the batch taking 25 s)
    assert re.search(r"count: .*Spark task retries [1-9]", err), err[-2000:]
    m = re.search(r"(\d+) micro-batches, stopped by duration; spout tuples sentences: (\d+)", err)
    assert m, err[-2000:]
    batches, n = int(m.group(1)), int(m.group(2))
    assert n > 0
    assert len(re.findall(r"^\[progress\] batch \d+: ", err, re.M)) == batches, "one progress line per micro-batch"
    got = [orjson.loads(line) for line in proc.stdout.decode().splitlines()]
    assert got == _plain_counts([SENTENCES[i % 5] for i in range(n)])


def test_the_readme_word_count_killed_mid_run_resumes_from_its_checkpoint_and_prints_what_the_local_engine_prints(
        tmp_path):
    """examples/wordcount.toml on Spark in batches of 300 sentences, its driver
    (and everything in its process group: JVM, workers, components)
    SIGKILLed after its second committed batch, then the same command again:
    the output is line for line the embedded engine's. The checkpoint is a
    file:// URI, and the driver reaches it only through its file system
    layer, as it would an object store: a POSIX call of its own under it
    fails the run (NO_POSIX_UNDER)."""
    ck = tmp_path / "ck dir"
    args = [str(EXAMPLES / "wordcount.toml"), "--checkpoint", f"file://{ck}", "-c",
            "multilang.spark.max.tuples.per.trigger=300"]
    audited = [*NO_POSIX_UNDER, str(ck), "run", "--engine", "spark"]
    env = {**ENV, "XDG_CACHE_HOME": str(tmp_path / "cache")}  # the spouts' records of message ids: the driver's disk
    local = subprocess.Popen(CLI + ["run", "--no-progress", str(EXAMPLES / "wordcount.toml")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=ENV, cwd=ROOT)
    proc = subprocess.Popen([*audited, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, cwd=ROOT, start_new_session=True)
    seen = []
    try:
        for raw in proc.stderr:  # the event: the driver reports its second committed micro-batch
            seen.append(raw.decode(errors="replace"))
            if raw.startswith(b"[progress] batch 1: "):
                break
        else:
            pytest.fail("the run ended before its second micro-batch:\n" + "".join(seen)[-3000:])
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    local_out, local_err = local.communicate(timeout=120)
    assert local.returncode == 0, local_err.decode()[-2000:]
    again = subprocess.run([*audited, *args], capture_output=True, env=env, cwd=ROOT, timeout=240)
    err = again.stderr.decode()
    assert again.returncode == 0, err[-3000:]
    assert again.stdout.decode().splitlines() == local_out.decode().splitlines()
    assert (ck / "state").is_dir() and (ck / "spouts" / "sentences" / "task-0" / "committed.json").is_file()
    assert not list(ck.rglob("*.sqlite")) and list((tmp_path / "cache" / "multilang" / "replay-ids").rglob("*.sqlite"))
    assert [orjson.loads(line) for line in again.stdout.decode().splitlines()] == _plain_counts(_alice())


def _signalled(args: list[str], tmp_path: Path, *when: bytes, sig: int = signal.SIGINT,
               group: bool = False) -> tuple[int, str]:
    """Run the CLI on Spark with ``args``; each time a line of its stderr
    starts with the next of ``when``, send it ``sig`` (``group``: to its
    whole process group, as a terminal, ``timeout`` or systemd's stop do);
    its exit code and its stderr, once every process that holds it has
    ended (within 240 s)."""
    proc = subprocess.Popen(CLI + ["run", "--engine", "spark", *args, "--checkpoint", str(tmp_path / "ck")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV, cwd=ROOT,
                            start_new_session=True)
    lines: queue.Queue[bytes | None] = queue.Queue()

    def read() -> None:
        for raw in proc.stderr:
            lines.put(raw)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    waits = list(when)
    deadline = time.monotonic() + 240
    try:
        while (raw := lines.get(timeout=max(0.0, deadline - time.monotonic()))) is not None:
            seen.append(raw.decode(errors="replace"))
            if waits and raw.startswith(waits[0]):
                waits.pop(0)
                os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
        proc.wait(timeout=10)
    except (queue.Empty, subprocess.TimeoutExpired):
        pytest.fail("the run (or a process it started) did not end:\n" + "".join(seen)[-3000:])
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    return proc.returncode, "".join(seen)


@pytest.mark.parametrize("when", [b"WARNING: Using incubator modules", b"Setting default log level"])
def test_a_signal_while_spark_starts_ends_the_run_at_once_with_no_traceback_and_no_jvm_left(tmp_path, when):
    # A trial's Ctrl-C during the start-up exited 130 after py4j logged three tracebacks: the main thread was
    # inside a call into the JVM, and PySpark's own SIGINT handler (installed by its SparkContext) called into
    # the JVM again from it. The session is now made in a thread of its own, which the main thread waits for.
    # And the JVM being started outlived the run (a process holding its stderr, past the 240 s allowed): it is
    # killed. The first line: the JVM starting; the second: its SparkContext being made.
    out = tmp_path / "out.jsonl"
    out.write_text('{"an earlier run": 1}\n')
    code, err = _signalled([str(_wordcount(tmp_path)), "-o", str(out)], tmp_path, when)
    assert code == 130 and err.rstrip().endswith(
        "[summary] interrupted by SIGINT before the topology started: nothing ran"), err[-3000:]  # as on one engine
    assert "Traceback" not in err and "ERROR root" not in err, err[-3000:]
    assert out.read_text() == '{"an earlier run": 1}\n'  # nothing ran: -o FILE left as it was (it was emptied)


def test_a_signal_to_the_process_group_stops_the_query_after_its_batch_with_the_output(tmp_path):
    # (said as the embedded engine says it; a trial found neither line on Spark.) Sent to the whole group, as
    # timeout(1) and systemd's stop send it: the JVM is in a session of its own, so only the CLI gets it.
    # Before, the JVM died of it at once: exit 143 with an empty output file and PySpark's traceback.
    out = tmp_path / "out.jsonl"
    code, err = _signalled([str(_wordcount(tmp_path)), "--duration", "60", "-c",
                            "multilang.spark.max.tuples.per.trigger=100", "-o", str(out)], tmp_path,
                           b"[progress] batch 0: ", sig=signal.SIGTERM, group=True)
    assert code == 143 and "SIGTERM: stopping after the batch running now" in err, err[-3000:]
    assert "[summary] interrupted by SIGTERM: the output is partial (the last tuple per key so far)" in err, err[-3000:]
    assert re.search(r"\[summary\] spark \(local\[\*\]\) .* stopped by signal", err), err[-3000:]
    assert "Traceback" not in err and "interrupted: Spark stopped" not in err, err[-3000:]
    n = int(re.search(r"spout tuples sentences: (\d+)", err).group(1))  # (the committed batches': in line order)
    assert n > 0 and out.read_text().splitlines() == [
        orjson.dumps(r).decode() for r in _plain_counts([line for line in _alice() if line.strip()][:n])], err[-3000:]


def test_a_second_signal_stops_a_running_query_at_once(tmp_path):
    # The first says what it does, as on the embedded engine. The second, cut short inside a call into the JVM,
    # left its connection broken for the next: "error: the Spark job failed: Answer from Java side is empty",
    # exit 1, in a trial.
    code, err = _signalled([str(_wordcount(tmp_path)), "--duration", "60", "-c",
                            "multilang.spark.max.tuples.per.trigger=100"], tmp_path, b"[progress] batch 0: ",
                           b"SIGINT: stopping after the batch running now")
    assert code == 130 and err.rstrip().endswith("interrupted"), err[-3000:]
    assert "the Spark job failed" not in err and "Traceback" not in err, err[-3000:]


def test_a_command_that_cannot_run_is_said_before_spark_starts_on_a_local_master(tmp_path):
    # A trial's bolt command not on PATH: exit 1 after 10 to 33 s of Spark, four task attempts and 10 Python
    # tracebacks, where the embedded engine says it in one line, exit 2. On a local master the executors run
    # the commands on this machine, in a copy of the topology's folder: checked first, the same way.
    from multilang.adapters.spark import run_topology

    for command, problem in [(["nosuchinterp", "split.py"], "command 'nosuchinterp' not found on PATH"),
                             (["ruby", "no_such_split.rb"], "script 'no_such_split.rb' not found")]:
        toml = _wordcount(tmp_path)
        split = orjson.dumps(["ruby", str(EXAMPLES / "ruby" / "split_bolt.rb")]).decode().replace(",", ", ")
        text = toml.read_text()
        assert f"command = {split}" in text
        toml.write_text(text.replace(f"command = {split}", f"command = {orjson.dumps(command).decode()}"))
        proc = _run([str(toml)], timeout=60)
        err = proc.stderr.decode()
        assert proc.returncode == 2 and f"bolt 'split': {problem}" in err, err[-2000:]
        assert "Traceback" not in err and "Setting default log level" not in err, err[-2000:]  # Spark never started
        with pytest.raises(TopologyError, match=f"bolt 'split': {problem}"):  # from Python too, given the file
            run_topology(str(toml))


def test_flag_mistakes_are_usage_errors(tmp_path):
    toml = _wordcount(tmp_path)
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "topology.json").write_text('{"topology": "other", "components": {}}')
    for args, message in [
        ([str(toml), "--checkpoint", str(ck)], "holds a run of another topology"),
        ([str(toml), "--state-dir", str(tmp_path / "st")], "--checkpoint"),
        ([str(toml), "--remote", "localhost:15002"], "a Spark Connect URL is sc://"),
        # nothing listens there: said at once, not after PySpark's minutes of retries
        ([str(toml), "--remote", "sc://127.0.0.1:1"], "cannot reach a Spark Connect server at 127.0.0.1:1"),
        ([str(toml), "--remote", "sc://:15002"], "no host in the URL"),
        # (a trial: Spark's client tried to register for 65 s, then failed with exit 1)
        ([str(toml), "--master", "spark://127.0.0.1:1,127.0.0.1:2"],
         "cannot reach a Spark master at 127.0.0.1:1 (Connection refused), 127.0.0.1:2 (Connection refused)"),
        ([str(toml), "--master", "spark://h:x"], "'h:x' is not HOST:PORT"),
        ([str(toml), "--master", "spark://127.0.0.1"], "'127.0.0.1' is not HOST:PORT"),
        ([str(toml), "--master", "spark://127.0.0.1:99999"], "'127.0.0.1:99999' is not HOST:PORT"),
        # (Spark started, then failed with a Java NoSuchFileException, exit 1: a trial)
        ([str(toml), "--archives", f"{tmp_path / 'env.tgz'}#env"], f"{tmp_path / 'env.tgz'} does not exist"),
        ([str(toml), "--archives", f"file://{tmp_path}#env"], f"{tmp_path} is not a file"),
    ]:
        proc = _run(args, timeout=60)
        assert proc.returncode == 2, proc.stderr.decode()[-2000:]
        assert message in proc.stderr.decode()
        assert "Traceback" not in proc.stderr.decode()
    # topology.workers (a Flux file from Storm often sets it) is not refused on Spark, nor silently dropped
    proc = _run([str(toml), "--remote", "sc://127.0.0.1:1", "-c", "topology.workers=2"], timeout=60)
    assert proc.returncode == 2 and b"warning: topology.workers 2 applies to the embedded engine; on --engine spark " \
        b"the executors run the tasks" in proc.stderr, proc.stderr.decode()[-2000:]
    local = subprocess.run(CLI + ["run", str(toml), "--checkpoint", str(tmp_path / "x")], capture_output=True,
                           env=ENV, timeout=60)
    assert local.returncode == 2 and b"--checkpoint applies to --engine spark" in local.stderr


def test_a_spark_run_that_fails_leaves_the_output_file_and_empties_the_dead_letter_file(tmp_path):
    # A trial: a Spark that could not start (a bad driver memory), a bad conf or a failed query replaced -o FILE
    # with an empty file, where README says a crashed run leaves it as it was; and a stale --dead-letter file
    # from an earlier run was left as it was, where the embedded engine empties it (this run's letters: none).
    out, letters = tmp_path / "out.jsonl", tmp_path / "dead.jsonl"
    out.write_text('{"an earlier run": 1}\n')
    letters.write_text('{"an earlier letter": 1}\n')
    # (2gb is a size to Spark, which checks it first (xyz: exit 2, tests/integration/test_cli.py), not to the JVM)
    proc = _run([str(_wordcount(tmp_path)), "-c", "spark.driver.memory=2gb", "-o", str(out),
                 "--dead-letter", str(letters)], timeout=120)
    assert proc.returncode == 1 and b"error: Spark's JVM did not start (its own words are above): " in proc.stderr, \
        proc.stderr[-3000:]
    # (Spark's own words do not name the key here: the message says which conf was given)
    assert b"the Spark conf given: spark.driver.memory=2gb" in proc.stderr, proc.stderr[-3000:]
    # With --remote local[N] the JVM's stderr comes through a copy (its token redacted): what it says shows
    proc = _run([str(_wordcount(tmp_path)), "--remote", "local[1]", "-c", "spark.driver.memory=2gb"], timeout=120)
    assert proc.returncode == 1 and b"Invalid maximum heap size: -Xmx2gb" in proc.stderr, proc.stderr[-3000:]
    assert out.read_text() == '{"an earlier run": 1}\n'
    assert letters.read_text() == ""
    # A value Spark's SQL conf refuses: a usage error naming the key and the value (a trial: exit 1 and "Error
    # while instantiating 'org.apache.spark.sql.internal.SessionStateBuilder'", neither named)
    proc = _run([str(_wordcount(tmp_path)), "-c", "spark.sql.shuffle.partitions=abc", "-o", str(out)], timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "error: a Spark conf value (-c spark.KEY=VALUE) is invalid: " in err, err[-3000:]
    assert """The value 'abc' in the config "spark.sql.shuffle.partitions" is invalid""" in err, err[-3000:]
    assert "Traceback" not in err and out.read_text() == '{"an earlier run": 1}\n'


def test_the_connect_servers_foreach_batch_worker_ends_when_the_server_does(tmp_path):
    # A trial: kill -9 of the CLI under --remote local[N] ended the server's JVM, and the Python process
    # that JVM runs foreachBatch in went on (its Connect client retries for minutes). Here a process named
    # as Spark's foreachBatch worker takes a batch writer's first step, and its parent (the JVM) is killed.
    pkg = tmp_path / "fakespark"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "foreach_batch_worker.py").write_text(textwrap.dedent("""\
        import sys, time
        from multilang.adapters.spark._streaming.topology import _end_with_the_server
        _end_with_the_server()
        print("watching", flush=True)
        time.sleep(120)
    """))
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         "w = subprocess.Popen([sys.executable, '-m', 'fakespark.foreach_batch_worker']); "
         "print(w.pid, flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    worker = int(parent.stdout.readline())
    try:
        assert parent.stdout.readline() == b"watching\n"
        parent.kill()
        parent.wait()

        def running() -> bool:
            try:
                return " (Z)" not in Path(f"/proc/{worker}/status").read_text()  # (a zombie ended)
            except FileNotFoundError:
                return False

        deadline = time.monotonic() + 60
        while running() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running()
    finally:
        try:
            os.kill(worker, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_stateful_bolt_that_keeps_crashing_ends_the_run_with_one_line_not_pages_of_stacks(tmp_path):
    # A trial: about 500 lines of Spark's and py4j's Python and Java stacks (each task attempt's, the
    # query's, the foreachBatch proxy's) came before the one-line error.
    bolt = tmp_path / "crashing_count.js"
    bolt.write_text(textwrap.dedent(f"""\
        'use strict';
        const {{ CountBolt }} = require({orjson.dumps(str(EXAMPLES / "node" / "count_bolt.js")).decode()});
        class Crashing extends CountBolt {{
          process(tup) {{
            this.seen = (this.seen || 0) + 1;
            if (this.seen === 20) {{ process.stderr.write("count: cannot go on\\n"); process.exit(3); }}
            super.process(tup);
          }}
        }}
        new Crashing().run();
    """))
    out = tmp_path / "out.jsonl"
    proc = _run([str(_wordcount(tmp_path, ["node", str(bolt)])), "--max-tuples", "50", "-o", str(out)], timeout=180)
    err = proc.stderr.decode()
    assert proc.returncode == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: the Spark job failed: StatefulBoltCrashed: component 'count' task "), err[-3000:]
    assert "Traceback" not in err and "\tat " not in err, err[-3000:]
    assert err.count("count: cannot go on") >= 1  # (the bolt's own words, from the multilang.spark log)
    assert len(err.splitlines()) < 150, err[-3000:]
