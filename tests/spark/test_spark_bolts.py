"""Shell bolts inside Spark partitions: RDD mapPartitions, DataFrame mapInArrow
(batch and streaming), the acker's release-on-completion, retries, dead letters,
schema errors and the warm process pool. Real Ruby, Node and Python processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from multilang.adapters.spark import (  # noqa: E402
    INPUT,
    DeadLetter,
    apply_bolts,
    group_by_fields,
    multilang_bolts,
    shell_bolt_partition,
)
from multilang.shellbolt import ShellBolt, TopologyBuilder  # noqa: E402

pytestmark = pytest.mark.spark

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES / "python"))
from split_bolt import words  # noqa: E402

LINES = [line.strip() for line in (EXAMPLES / "data" / "alice.txt").read_text(encoding="utf-8").splitlines()
         if line.strip()]
EXPECTED = Counter(w for line in LINES for w in words(line))

RUBY_SPLIT = ["ruby", "ruby/split_bolt.rb"]
NODE_SPLIT = ["node", "node/split_bolt.js"]
NODE_COUNT = ["node", "node/count_bolt.js"]

# A Python bolt for fault tests: splits like the example bolts; "KILL-ME" makes
# it SIGKILL itself the first time (a marker file remembers); rows containing
# BAD are failed; rows containing HANG are never acked.
TEST_BOLT = textwrap.dedent("""\
    import os, signal, sys
    sys.path.insert(0, {examples!r})
    from multilang import Bolt
    from split_bolt import words

    MARKER = sys.argv[1]

    class TestBolt(Bolt):
        def process(self, tup):
            s = tup.values[0]
            if s == "KILL-ME" and not os.path.exists(MARKER):
                open(MARKER, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            if "BAD" in s:
                self.fail(tup)
                return
            if "HANG" in s:
                return
            for w in words(s):
                self.emit([w], anchors=[tup], need_task_ids=False)
            self.ack(tup)

    TestBolt().run()
""")


@pytest.fixture
def test_bolt(tmp_path):
    script = tmp_path / "test_bolt.py"
    script.write_text(TEST_BOLT.format(examples=str(EXAMPLES / "python")))
    return ["python", str(script), str(tmp_path / "killed.marker")]


def test_rdd_word_count_ruby_split_node_count(spark):
    """Ruby split per partition, fields grouping as in the local engine, Node
    count (stateful: one fresh process per task partition)."""
    sc = spark.sparkContext
    split = shell_bolt_partition(RUBY_SPLIT, fields=["word"], resource_dir=EXAMPLES)
    count = shell_bolt_partition(NODE_COUNT, fields=["word", "count"], resource_dir=EXAMPLES, stateful=True)
    words_rdd = sc.parallelize(LINES, 4).mapPartitions(split)
    counted = group_by_fields(words_rdd, [0], 2).mapPartitions(count)
    final = counted.reduceByKey(max).collectAsMap()
    assert final == dict(EXPECTED)
    c = split.counters.value
    assert (c["rows_in"], c["acked"], c["failed"]) == (len(LINES), len(LINES), 0)
    assert c["tuples_out"] == sum(EXPECTED.values())
    assert count.counters.value["components"]["count_bolt"]["executed"] == sum(EXPECTED.values())


def test_dataframe_split_then_spark_counts(spark):
    df = spark.createDataFrame([(line,) for line in LINES], "sentence string").repartition(3)
    t = multilang_bolts(RUBY_SPLIT, output_schema="word string", resource_dir=EXAMPLES)
    got = {r["word"]: r["count"] for r in df.transform(t).groupBy("word").count().collect()}
    assert got == dict(EXPECTED)
    assert t.counters.value["tuples_out"] == sum(EXPECTED.values())


def test_dag_in_one_partition(spark):
    """Ruby split (2 tasks) -> Node count (2 tasks, fields on word), inside one
    partition, every row a root of the shared acker."""
    b = TopologyBuilder()
    b.set_bolt("split", ShellBolt(RUBY_SPLIT, fields=["word"]), parallelism=2).shuffle_grouping(INPUT)
    b.set_bolt("count", ShellBolt(NODE_COUNT, fields=["word", "count"]), parallelism=2) \
        .fields_grouping("split", ["word"])
    fn = shell_bolt_partition(b, input_fields=["sentence"], resource_dir=EXAMPLES, stateful=True)
    out = spark.sparkContext.parallelize(LINES, 1).mapPartitions(fn)
    assert out.reduceByKey(max).collectAsMap() == dict(EXPECTED)
    c = fn.counters.value
    assert c["acked"] == len(LINES) and c["tuples_out"] == sum(EXPECTED.values())
    assert set(c["components"]) == {"split", "count"}


def test_killed_bolt_changes_nothing(spark, test_bolt, tmp_path):
    """The bolt SIGKILLs itself mid-partition: its in-flight rows fail, are
    replayed through the restarted process, and the output is exactly the
    same, in the same order (ordered release)."""
    lines = LINES[:400]
    lines.insert(150, "KILL-ME")
    fn = shell_bolt_partition(test_bolt, fields=["word"], ordered=True)
    got = spark.sparkContext.parallelize(lines, 2).mapPartitions(fn).collect()
    assert (tmp_path / "killed.marker").exists()
    assert got == [(w,) for line in lines for w in words(line)]
    c = fn.counters.value
    assert c["restarts"] == 1
    assert c["retried"] >= 1 and c["retried"] == c["failed"]
    assert c["acked"] == len(lines) and c["dead_letter"] == 0


def test_killed_bolt_in_mapinarrow(spark, test_bolt, tmp_path):
    lines = LINES[:300] + ["KILL-ME"] + LINES[300:500]
    df = spark.createDataFrame([(line,) for line in lines], "sentence string").coalesce(2)
    out = apply_bolts(df, test_bolt, output_schema="word string")
    got = Counter(r["word"] for r in out.collect())
    assert got == Counter(w for line in lines for w in words(line))
    assert (tmp_path / "killed.marker").exists()


def test_streaming_file_source_through_shell_bolts(spark, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    half = len(LINES) // 2
    (src / "a.txt").write_text("\n".join(LINES[:half]) + "\n", encoding="utf-8")
    (src / "b.txt").write_text("\n".join(LINES[half:]) + "\n", encoding="utf-8")
    stream = spark.readStream.text(str(src))
    words_df = stream.transform(multilang_bolts(NODE_SPLIT, output_schema="word string", resource_dir=EXAMPLES))
    q = (words_df.writeStream.format("memory").queryName("ml_stream_words").outputMode("append")
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    got = Counter(r["word"] for r in spark.table("ml_stream_words").collect())
    assert got == EXPECTED


def test_schema_wrong_arity_names_component_and_tuple(spark):
    df = spark.createDataFrame([("the cat sat",)], "sentence string")
    t = multilang_bolts(RUBY_SPLIT, output_schema="word string, n int", resource_dir=EXAMPLES)
    with pytest.raises(Exception) as info:
        df.transform(t).collect()
    msg = str(info.value)
    assert "OutputSchemaError" in msg
    assert "component 'split_bolt'" in msg and "tuple of 1 values" in msg and '["the"]' in msg


def test_schema_wrong_type_names_component_and_tuple(spark):
    df = spark.createDataFrame([("the cat sat",)], "sentence string")
    t = multilang_bolts(NODE_SPLIT, output_schema="word int", resource_dir=EXAMPLES)
    with pytest.raises(Exception) as info:
        df.transform(t).collect()
    msg = str(info.value)
    assert "OutputSchemaError" in msg and "component 'split_bolt'" in msg
    assert "field 'word' of type int32" in msg and "'the'" in msg


def test_schema_mismatch_with_declared_fields_fails_at_build(spark):
    df = spark.createDataFrame([("x",)], "sentence string")
    from multilang.errors import TopologyError

    with pytest.raises(TopologyError, match="declares 1 fields"):
        apply_bolts(df, ShellBolt(RUBY_SPLIT, fields=["word"]), output_schema="a string, b string",
                    resource_dir=EXAMPLES)


def test_dead_letter_column(spark, test_bolt):
    lines = ["one fish", "two BAD fish", "red fish", "blue fish HANG"]
    df = spark.createDataFrame([(line,) for line in lines], "sentence string").coalesce(1)
    t = multilang_bolts(test_bolt, output_schema="word string", dead_letter="column", max_retries=1,
                        conf={"topology.message.timeout.secs": 1})
    rows = df.transform(t).collect()
    ok = [r["word"] for r in rows if r["_status"] == "ok"]
    dead = {r["_input"]: r["_error"] for r in rows if r["_status"] == "dead_letter"}
    assert Counter(ok) == Counter(["one", "fish", "red", "fish"])
    assert all(r["word"] is None for r in rows if r["_status"] == "dead_letter")
    assert set(dead) == {'{"sentence":"two BAD fish"}', '{"sentence":"blue fish HANG"}'}
    assert dead['{"sentence":"two BAD fish"}'].startswith("failed")
    assert dead['{"sentence":"blue fish HANG"}'].startswith("timed out")
    c = t.counters.value
    assert (c["failed"], c["retried"], c["dead_letter"], c["acked"]) == (4, 2, 2, 2)


def test_dead_letter_records_in_rdd(spark, test_bolt):
    fn = shell_bolt_partition(test_bolt, fields=["word"], dead_letter="record", max_retries=1)
    out = spark.sparkContext.parallelize(["a b", "c BAD"], 1).mapPartitions(fn).collect()
    assert out[:2] == [("a",), ("b",)]
    assert isinstance(out[2], DeadLetter) and out[2].input == ["c BAD"] and out[2].attempts == 2


def test_failed_rows_raise_by_default(spark, test_bolt):
    fn = shell_bolt_partition(test_bolt, fields=["word"], max_retries=1)
    with pytest.raises(Exception) as info:
        spark.sparkContext.parallelize(["a b", "c BAD"], 1).mapPartitions(fn).collect()
    msg = str(info.value)
    assert "RowFailed" in msg and '["c BAD"]' in msg and "failed 2 times (max_retries=1)" in msg


def test_warm_pool_python_and_env_reach_subprocess(spark, tmp_path):
    script = tmp_path / "env_bolt.py"
    script.write_text(textwrap.dedent("""\
        import os, sys
        from multilang import BasicBolt

        class EnvBolt(BasicBolt):
            def process(self, tup):
                self.emit([sys.executable, os.environ.get("PATH"), os.environ.get("LANG") or os.environ.get("LC_ALL"),
                           os.environ.get("ML_TEST_VAR"), os.getpid()])

        EnvBolt().run()
    """))
    fn = shell_bolt_partition(["python", str(script)], env={"ML_TEST_VAR": "hello"})
    # 4 tasks on 2 cores: Python workers are reused, and so are their warm bolt processes.
    out = spark.sparkContext.parallelize(range(8), 4).mapPartitions(fn).collect()
    exe, path, lang, var, _ = out[0]
    assert os.path.realpath(exe) == os.path.realpath(sys.executable)
    assert path == os.environ["PATH"] and lang and var == "hello"
    assert fn.counters.value["warm_reuse"] >= 1
    assert len({r[4] for r in out}) < 4


def test_stateful_bolt_crash_fails_the_spark_task(spark, test_bolt):
    """A stateful spec cannot rebuild a dead process's state inside the
    partition: the task fails (Spark would rerun the whole partition)."""
    fn = shell_bolt_partition(test_bolt, fields=["word"], stateful=True)
    with pytest.raises(Exception) as info:
        spark.sparkContext.parallelize(["a b"] * 50 + ["KILL-ME"] + ["c d"] * 50, 1).mapPartitions(fn).collect()
    msg = str(info.value)
    assert "StatefulBoltCrashed" in msg and "test_bolt" in msg and "reruns the whole partition" in msg


def test_missing_command_is_a_clear_error(spark):
    fn = shell_bolt_partition(["no-such-command-xyz", "x"], fields=["word"])
    with pytest.raises(Exception, match="command 'no-such-command-xyz' not found on PATH"):
        spark.sparkContext.parallelize(["a"], 1).mapPartitions(fn).collect()


def _split_then_freeze_count(fn):
    def run(it):
        import gc

        out = list(fn(it))
        return [("words", len(out)), ("frozen", gc.get_freeze_count())]

    return run


def test_the_worker_heap_is_frozen_after_a_partition(spark):
    """docs/SPARK.md, "Garbage collection": once per Python worker,
    the objects alive after the first lease are frozen (gc.freeze), and the
    partition's output is unchanged."""
    split = shell_bolt_partition(RUBY_SPLIT, fields=["word"], resource_dir=EXAMPLES)
    got = spark.sparkContext.parallelize(LINES, 2).mapPartitions(_split_then_freeze_count(split)).collect()
    assert sum(n for k, n in got if k == "words") == sum(EXPECTED.values())
    frozen = [n for k, n in got if k == "frozen"]
    assert len(frozen) == 2 and min(frozen) > 10_000  # PySpark, pyarrow, trio, ... (about 60,000)


@pytest.mark.parametrize("setting, frozen", [(None, True), ("0", False)])
def test_the_worker_heap_freeze_can_be_turned_off(setting, frozen):
    """MULTILANG_SPARK_GC_FREEZE=0 in the workers' environment leaves the
    collector alone (a fresh interpreter: the freeze is once per process)."""
    env = {k: v for k, v in os.environ.items() if k != "MULTILANG_SPARK_GC_FREEZE"}
    if setting is not None:
        env["MULTILANG_SPARK_GC_FREEZE"] = setting
    code = ("import gc; from multilang.adapters import spark as s; s._freeze_worker_heap(); "
            "n = gc.get_freeze_count(); s._freeze_worker_heap(); print(n, gc.get_freeze_count())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    first, second = map(int, out.split())
    assert (first > 0) is frozen and second == first


GROUP_ACK_BOLT = """\
from multilang import Bolt

class GroupAck(Bolt):
    # acks only in groups of 150: more than Storm's default window of 100
    def initialize(self, conf, context):
        self.held = []

    def process(self, tup):
        self.held.append(tup)
        if len(self.held) == 150:
            for t in self.held:
                self.emit([t.values[0].upper()], anchors=[t])
                self.ack(t)
            self.held = []

GroupAck().run()
"""


def test_a_bolt_may_hold_max_in_flight_tuples(spark, tmp_path):
    """In a partition, topology.shellbolt.max.pending defaults to
    max_in_flight (docs/SPARK.md): a bolt that acks in groups of 150
    gets them at once instead of stalling at Storm's 100 until the message
    timeout. An explicit setting is kept."""
    script = tmp_path / "group_ack.py"
    script.write_text(GROUP_ACK_BOLT)
    fn = shell_bolt_partition(["python", str(script)], conf={"topology.message.timeout.secs": 60})
    words = [f"w{i}" for i in range(300)]
    out = spark.sparkContext.parallelize(words, 1).mapPartitions(fn).collect()
    assert sorted(v for (v,) in out) == sorted(w.upper() for w in words)
    c = fn.counters.value
    assert (c["acked"], c["failed"], c["retried"]) == (300, 0, 0)
    assert fn.spec.conf["topology.shellbolt.max.pending"] == 1000
    kept = shell_bolt_partition(["python", str(script)], conf={"topology.shellbolt.max.pending": 100})
    assert kept.spec.conf["topology.shellbolt.max.pending"] == 100


# --- the direct lane (adapters/spark/_engine/engine.py _LeaseSink) ------------------------------------
#
# Run in this process (no Spark job: the partition function is called on an
# iterator), so the lane can be switched off with MULTILANG_SPARK_DIRECT=0 and
# both lanes must give the same rows.

SHAPES_BOLT = textwrap.dedent("""\
    import sys
    from multilang import Bolt

    class Shapes(Bolt):
        def initialize(self, conf, context):
            self.held = None
            self.flaked = False
            self.ticked = False

        def process_tick(self, tup):  # an emit anchored to a tick: no row's, out at once
            if not self.ticked:
                self.ticked = True
                self.emit(["tick"], anchors=[tup])
            self.ack(tup)

        def process(self, tup):
            s = tup.values[0]
            if s.startswith("free"):  # unanchored: released at once
                self.emit([s + "!"])
            elif s.startswith("pair"):  # one output anchored to two rows
                if self.held is None:
                    self.held = tup
                    return
                first, self.held = self.held, None
                self.emit([first.values[0] + "+" + s], anchors=[first, tup])
                self.ack(first)
            elif s == "flaky":  # an emit error between two emits, first attempt only
                self.emit(["flaky1"], anchors=[tup])
                if not self.flaked:
                    self.flaked = True
                    self.emit([s], stream="nowhere", anchors=[tup])
                self.emit(["flaky2"], anchors=[tup])
            elif s == "undeclared":  # an emit error: the row's tree fails, every attempt
                self.emit([s], stream="nowhere", anchors=[tup])
            elif s == "ids":  # wants task ids: an output has none
                self.emit(["ids:" + str(self.emit([s], anchors=[tup], need_task_ids=True))], anchors=[tup])
            else:
                for w in s.split():
                    self.emit([w], anchors=[tup])
            self.ack(tup)

    Shapes().run()
""")


def _assert_the_fault_rows(ok, dead, lines, tmp_path):
    """The fault-test bolt's rows (KILL-ME, then BAD and HANG last): each
    row's words once, in order, the killed process's rows replayed, the
    failed and the hung row dead letters naming their cause."""
    assert ok == [(w,) for line in lines[:-2] for w in words(line)]
    assert (tmp_path / "killed.marker").exists()
    assert set(dead) == {("two BAD fish",), ("blue fish HANG",)}
    assert dead[("two BAD fish",)].error.startswith("failed") and dead[("two BAD fish",)].attempts == 2
    assert dead[("blue fish HANG",)].error.startswith("timed out")


def _in_process(fn, lines):
    out = list(fn(iter(lines)))
    return [r for r in out if not isinstance(r, DeadLetter)], {tuple(r.input): r for r in out if isinstance(r, DeadLetter)}


@pytest.mark.parametrize("lane", ["direct", "general"])
def test_both_lanes_keep_every_guarantee(lane, monkeypatch, test_bolt, tmp_path):
    """A single bolt takes the direct lane; with it off, the general one.
    Either way: a killed process replays its rows (each row's words once, in
    order), a failed row and a hung row (message timeout) become dead
    letters naming the cause, an unanchored emit comes out at once, an emit
    anchored to two rows comes out once both are acked, an emit to an
    undeclared stream fails its row (and what it emitted after that error
    is not kept for the replay), an emit that wants task ids gets [], and
    an emit anchored to a tick tuple comes out at once."""
    monkeypatch.setenv("MULTILANG_SPARK_DIRECT", "1" if lane == "direct" else "0")
    lines = LINES[:60] + ["KILL-ME"] + LINES[60:120] + ["two BAD fish", "blue fish HANG"]
    fn = shell_bolt_partition(test_bolt, fields=["word"], dead_letter="record", max_retries=1, ordered=True,
                              warm=False, counters=False, conf={"topology.message.timeout.secs": 2})
    ok, dead = _in_process(fn, lines)
    _assert_the_fault_rows(ok, dead, lines, tmp_path)

    script = tmp_path / "shapes.py"
    script.write_text(SHAPES_BOLT)
    fn = shell_bolt_partition(["python", str(script)], fields=["v"], dead_letter="record", max_retries=1,
                              warm=False, counters=False, conf={"topology.tick.tuple.freq.secs": 1})

    def rows():
        yield from ["a b", "free1", "pair1", "c", "pair2", "undeclared", "ids", "flaky"]
        time.sleep(1.6)  # a tick comes
        yield "late"

    ok, dead = _in_process(fn, rows())
    assert sorted(ok) == sorted([("a",), ("b",), ("free1!",), ("pair1+pair2",), ("c",), ("ids",), ("ids:[]",),
                                 ("flaky1",), ("flaky2",), ("tick",), ("late",)])
    assert list(dead) == [("undeclared",)] and dead[("undeclared",)].attempts == 2


PASS_BOLT = textwrap.dedent("""\
    from multilang import BasicBolt

    class Pass(BasicBolt):
        def process(self, tup):
            self.emit(list(tup.values))

    Pass().run()
""")


@pytest.mark.parametrize("where", ["first", "second"])
def test_a_chain_on_the_direct_lane_keeps_every_guarantee(where, monkeypatch, test_bolt, tmp_path):
    """A chain of two bolts takes the direct lane, with the fault-test bolt
    first or second: a process killed in either replays its rows from the
    first bolt (each row's words once, in order), a row failed or never
    acked by the second bolt becomes a dead letter naming the cause."""
    monkeypatch.setenv("MULTILANG_SPARK_DIRECT", "1")
    script = tmp_path / "pass.py"
    script.write_text(PASS_BOLT)
    chain = [test_bolt, ["python", str(script)]] if where == "first" else [["python", str(script)], test_bolt]
    lines = LINES[:40] + ["KILL-ME"] + LINES[40:80] + ["two BAD fish", "blue fish HANG"]
    fn = shell_bolt_partition(chain, fields=["word"], dead_letter="record", max_retries=1, ordered=True,
                              warm=False, counters=False, conf={"topology.message.timeout.secs": 2})
    ok, dead = _in_process(fn, lines)
    _assert_the_fault_rows(ok, dead, lines, tmp_path)


BATCHING_POISON_BOLT = textwrap.dedent("""\
    import sys
    from multilang import Bolt

    class Batching(Bolt):  # acks its input three at a time; dies on "poison"
        def initialize(self, conf, context):
            self.held = []

        def process(self, tup):
            if tup.values[0] == "poison":
                raise SystemExit(3)
            self.held.append(tup)
            if len(self.held) == 3:
                for t in self.held:
                    self.emit([t.values[0]], anchors=self.held)
                self.ack_many(self.held)
                self.held = []

    Batching().run()
""")


def test_a_bolt_that_batches_its_input_ends_the_crash_isolation_instead_of_hanging(tmp_path):
    """Rows in flight beside a crash are tried alone; a bolt that completes
    a row only with two more never completes one alone: the row times out,
    and the lease goes back to sending rows together, charging each death
    to every row it failed. Every row ends as an output or a dead letter,
    the poison among the dead."""
    script = tmp_path / "batching.py"
    script.write_text(BATCHING_POISON_BOLT)
    rows = [f"v{i:02d}" for i in range(30)]
    rows.insert(10, "poison")
    fn = shell_bolt_partition(["python", str(script)], fields=["out"], dead_letter="record", max_retries=3,
                              warm=False, counters=False, conf={"topology.message.timeout.secs": 2})
    ok, dead = _in_process(fn, rows)
    assert ("poison",) in dead
    assert sorted([v for (v,) in ok] + [v for (v,) in dead]) == sorted(rows), (ok, list(dead))


FLAKY_BOLT = textwrap.dedent("""\
    import os, sys
    from multilang import BasicBolt

    MARK = sys.argv[1]

    class Flaky(BasicBolt):  # dies the first time it sees a "flaky" row; always on "poison"
        def process(self, tup):
            v = tup.values[0]
            if v.startswith("flaky") and not os.path.exists(MARK + v):
                open(MARK + v, "w").close()
                os._exit(4)
            if v == "poison":
                raise SystemExit(3)
            self.emit([v])

    Flaky().run()
""")


def test_a_row_that_dies_once_beside_another_is_retried_and_each_partition_has_its_own_restart_budget(tmp_path):
    """A trial: a row in flight when another row killed the process, that
    then killed it once itself, was charged for both deaths and given up
    at max_retries=1; and with a warm engine the third partition in a
    minute with one poison row gave up (the restart budget ran on across
    partitions)."""
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY_BOLT)
    rows = [f"v{i:03d}" for i in range(300)]
    rows.insert(100, "flaky1")
    rows.insert(200, "flaky2")
    fn = shell_bolt_partition(["python", str(script), str(tmp_path / "mark-")], fields=["out"],
                              dead_letter="record", max_retries=1, counters=False)
    ok, dead = _in_process(fn, rows)
    assert not dead and sorted(v for (v,) in ok) == sorted(rows)
    fn = shell_bolt_partition(["python", str(script), str(tmp_path / "mark-")], fields=["out"],
                              dead_letter="record", max_retries=0, counters=False)  # (warm: one engine)
    for _ in range(3):  # each poison: 2 deaths (beside others, then alone) of the budget's 5 a minute
        rows = [f"v{i:03d}" for i in range(300)]
        rows.insert(150, "poison")
        ok, dead = _in_process(fn, rows)
        assert list(dead) == [("poison",)] and len(ok) == 300


def test_the_direct_lane_is_for_shell_bolts_fed_by_the_rows_one_after_another(monkeypatch):
    from multilang.adapters.spark import _Engine, _make_spec
    from multilang.shellbolt import Runtime

    def lane(spec, conf=None):
        s = _make_spec(spec, fields=None, input_fields=["sentence"], output=None, conf=conf, resource_dir=EXAMPLES,
                       cwd=None, env=None, max_in_flight=1000)
        return [c.name for c in _Engine._lane_shape(Runtime(s.topology()), s)]

    assert lane(RUBY_SPLIT) == ["split_bolt"]
    two = TopologyBuilder()
    two.set_bolt("split", ShellBolt(RUBY_SPLIT, fields=["word"]), parallelism=2).fields_grouping(INPUT, ["sentence"])
    assert lane(two) == ["split"]  # any grouping that picks one task per row
    assert lane([RUBY_SPLIT, NODE_COUNT]) == ["split_bolt", "count_bolt"]  # a chain
    assert lane([RUBY_SPLIT, NODE_COUNT], conf={"multilang.hold.emits.until.ack": True}) == []
    fan = TopologyBuilder()  # two bolts reading the rows: a DAG, the general lane
    fan.set_bolt("a", ShellBolt(RUBY_SPLIT, fields=["word"])).shuffle_grouping(INPUT)
    fan.set_bolt("b", ShellBolt(RUBY_SPLIT, fields=["word"])).shuffle_grouping(INPUT)
    assert lane(fan) == []
    every = TopologyBuilder()
    every.set_bolt("split", ShellBolt(RUBY_SPLIT, fields=["word"]), parallelism=2).all_grouping(INPUT)
    assert lane(every) == []  # a row to every task: a tree of several tuples
    tail = TopologyBuilder()
    tail.set_bolt("split", ShellBolt(RUBY_SPLIT, fields=["word"])).shuffle_grouping(INPUT)
    tail.set_bolt("count", ShellBolt(NODE_COUNT, fields=["word", "count"]), parallelism=2).all_grouping("split")
    assert lane(tail) == []
    assert lane(RUBY_SPLIT, conf={"topology.acker.executors": 0}) == []
    monkeypatch.setenv("MULTILANG_SPARK_DIRECT", "0")
    assert lane(RUBY_SPLIT) == []
