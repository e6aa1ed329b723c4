"""run_topology (`multilang run --engine spark`) on the test run's session: fields,
global and all groupings give the embedded engine's output, and what the engine
cannot run is refused. The word count through Ruby and Node bolts, kills and
unbounded spouts are in test_streaming_engine.py."""

from __future__ import annotations

import sys
import textwrap
from collections import Counter
from pathlib import Path

import orjson
import pytest
import trio

pytest.importorskip("pyspark")

from multilang.adapters.spark import run_topology  # noqa: E402
from multilang.errors import TopologyError  # noqa: E402
from multilang.shellbolt import Runtime, load_topology  # noqa: E402

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES / "python"))
from split_bolt import words  # noqa: E402


GROUPINGS_TOML = """\
[topology]
name = "groupings"

[spouts.sentences]
command = ["python", "{ex}/python/sentence_spout.py", "text.txt"]
fields = ["sentence"]

[bolts.split]
command = ["python", "{ex}/python/split_bolt.py"]
fields = ["word"]
parallelism = 2
inputs = [{{ source = "sentences", grouping = "shuffle" }}]

[bolts.count]
command = ["ruby", "{ex}/ruby/count_bolt.rb"]
fields = ["word", "count"]
parallelism = 3
inputs = [{{ source = "split", grouping = "fields", fields = ["word"] }}]

[bolts.total]
command = ["python", "{ex}/python/count_bolt.py"]
fields = ["word", "count"]
parallelism = 2
inputs = [{{ source = "split", grouping = "global" }}]

[bolts.everywhere]
command = ["node", "{ex}/node/count_bolt.js"]
fields = ["word", "count"]
parallelism = 2
inputs = [{{ source = "split", grouping = "all" }}]
"""


def test_fields_global_all_groupings_match_the_local_engine(spark, tmp_path):
    lines = (EXAMPLES / "data" / "alice.txt").read_text(encoding="utf-8").splitlines()[:60]
    (tmp_path / "text.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    toml = tmp_path / "groupings.toml"
    toml.write_text(GROUPINGS_TOML.format(ex=EXAMPLES))

    local: list[dict] = []
    rt = Runtime(load_topology(toml), on_output=local.append)
    assert trio.run(lambda: rt.run(until_done=True)).ok

    result = run_topology(load_topology(toml), spark=spark)
    key = lambda r: orjson.dumps(r, option=orjson.OPT_SORT_KEYS)  # noqa: E731
    assert Counter(map(key, result.outputs)) == Counter(map(key, local))
    n_words = sum(1 for line in lines for _ in words(line.strip()))
    by_comp = Counter(r["component"] for r in result.outputs)
    assert by_comp == {"count": n_words, "total": n_words, "everywhere": 2 * n_words}
    assert result.counters["everywhere"]["rows_in"] == 2 * n_words
    assert result.ok


def test_max_tuples_reads_that_many_from_a_spout_and_a_spout_that_runs_dry_first_ends_the_run(spark, tmp_path):
    # A trial: --max-tuples 50 read a whole first micro-batch (1,080 sentences) and printed its counts; and
    # with more than the spout has (--max-tuples 100000, 1,080 sentences) the query ran for ever.
    rt = Runtime(load_topology(EXAMPLES / "wordcount.toml"))
    local = trio.run(lambda: rt.run(max_tuples=50))
    result = run_topology(load_topology(EXAMPLES / "wordcount.toml"), spark=spark, max_tuples=50)
    assert (result.spout_tuples, result.stopped_by) == ({"sentences": 50}, "max_tuples")
    by_word = lambda records: sorted(records, key=lambda r: r["word"])  # noqa: E731
    assert by_word(result.outputs) == by_word(local.outputs) and sum(r["count"] for r in local.outputs) > 50
    everything = run_topology(load_topology(EXAMPLES / "wordcount.toml"), spark=spark, max_tuples=100_000)
    sentences = [line for line in (EXAMPLES / "data" / "alice.txt").read_text(encoding="utf-8").splitlines()
                 if line.strip()]
    assert (everything.spout_tuples, everything.stopped_by) == ({"sentences": len(sentences)}, "done")


def test_max_tuples_is_shared_by_the_spout_tasks_and_read_no_further(spark, tmp_path):
    # Each spout task's source read up to all of --max-tuples, the driver stopping once the committed
    # batches held it: two spout tasks read a whole first batch each, past the limit. Now each reads
    # its share (26 and 25 of 51), as host workers' spouts do. Both tasks read the file from its start.
    toml = tmp_path / "two.toml"
    toml.write_text((EXAMPLES / "wordcount.toml").read_text()
                    .replace('"data/alice.txt"', f'"{EXAMPLES}/data/alice.txt"')
                    .replace("[spouts.sentences]", "[spouts.sentences]\nparallelism = 2", 1)
                    .replace('"python/', f'"{EXAMPLES}/python/').replace('"ruby/', f'"{EXAMPLES}/ruby/')
                    .replace('"node/', f'"{EXAMPLES}/node/'))
    result = run_topology(load_topology(toml), spark=spark, max_tuples=51)
    assert (result.spout_tuples, result.stopped_by) == ({"sentences": 51}, "max_tuples")
    sentences = [line.strip() for line in (EXAMPLES / "data" / "alice.txt").read_text(encoding="utf-8").split("\n")
                 if line.strip()]
    expected = Counter(w for s in sentences[:26] + sentences[:25] for w in words(s))
    assert {r["word"]: r["count"] for r in result.outputs} == dict(expected)


def test_a_spout_slower_to_start_than_availablenowidlems_is_waited_for(spark, tmp_path):
    # The source took a spout for drained after 200 ms of empty nexts: a spout quiet for its first half
    # second read nothing. Before its first tuple it now gets multilang.spout.start.secs (here 3 s).
    toml = tmp_path / "slow.toml"
    toml.write_text(textwrap.dedent(f"""\
        [topology.conf]
        "multilang.spout.start.secs" = 20
        [spouts.items]
        command = ["python", "{ROOT}/tests/integration/components/slow_spout.py", "0.5", "6"]
        fields = ["item"]
        [bolts.echo]
        command = ["python", "{EXAMPLES}/python/split_bolt.py"]
        fields = ["item"]
        inputs = [{{ source = "items", grouping = "shuffle" }}]
        [output]
        component = "echo"
    """))
    result = run_topology(load_topology(toml), spark=spark)
    assert (result.spout_tuples, result.stopped_by) == ({"items": 6}, "done")
    assert sorted(r["item"] for r in result.outputs) == [f"item{i}" for i in range(6)]


def test_direct_grouping_is_rejected(spark, tmp_path):
    toml = tmp_path / "direct.toml"
    toml.write_text(textwrap.dedent(f"""\
        [spouts.s]
        command = ["python", "{EXAMPLES}/python/sentence_spout.py", "x.txt"]
        fields = ["sentence"]
        [bolts.b]
        command = ["python", "{EXAMPLES}/python/split_bolt.py"]
        fields = ["word"]
        inputs = [{{ source = "s", grouping = "direct" }}]
    """))
    with pytest.raises(TopologyError, match="direct groupings"):
        run_topology(load_topology(toml), spark=spark)


def test_dead_letters_name_the_bolt_task_the_input_and_the_cause_as_the_embedded_engine_does(spark, tmp_path):
    # A trial's dead letters on Spark said "task": 0 whatever the task, and their keys ("values", "error")
    # were not the embedded engine's --dead-letter line ("input", "cause"). A row that fails every retry is
    # given up on; the rows of the other lines go on.
    lines = [f"bad {i}" if i % 3 == 0 else f"good {i}" for i in range(30)]
    (tmp_path / "text.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    toml = tmp_path / "fail.toml"
    toml.write_text(textwrap.dedent(f"""\
        [spouts.sentences]
        command = ["python", "{EXAMPLES}/python/sentence_spout.py", "text.txt"]
        fields = ["sentence"]
        [bolts.upper]
        command = ["ruby", "{ROOT}/tests/spark/components/bolts_fail.rb"]
        fields = ["value"]
        parallelism = 2
        inputs = [{{ source = "sentences", grouping = "fields", fields = ["sentence"] }}]
    """))
    topology = load_topology(toml)
    result = run_topology(topology, spark=spark)
    assert not result.ok
    assert sorted(r["value"] for r in result.outputs) == sorted(line.upper() for line in lines
                                                               if line.startswith("good"))
    dead = result.dead_letters
    assert sorted(d["input"][0] for d in dead) == sorted(line for line in lines if line.startswith("bad"))
    tasks = topology.components["upper"].tasks  # (Storm's ids: sentences 1, upper 2 and 3)
    assert {d["task"] for d in dead} == set(tasks), dead  # each of the bolt's tasks had bad lines
    for d in dead:
        assert set(d) == {"component", "task", "input", "cause", "attempts", "source", "stream"}, d
        assert (d["component"], d["source"], d["stream"], d["attempts"]) == ("upper", "sentences", "default", 4), d
        assert f"cannot take row {d['input'][0]}" in d["cause"], d
