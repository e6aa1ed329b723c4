"""One validation pass for topologies and conf (TOML, Flux YAML, TopologyBuilder).

Typos never change a result silently, bad values never end in a traceback or
a run that never ends: each is a TopologyError naming the file, the component,
the key and the cause, before any process starts. Unknown conf keys pass
through to the components (as in Storm), with a warning when they are a near
miss of a key we read.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from multilang._cli.main import main as cli_main
from multilang.errors import TopologyError
from multilang.shellbolt._model.conf import SCHEMA, check_value, near_miss, suggest
from multilang.shellbolt._model.flux import load_flux
from multilang.shellbolt._model.topology import (
    DEFAULT_CONF, PythonBolt, PythonSpout, ShellSpout, TopologyBuilder, load_topology,
)
from topology_fuzz import check, mutant

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
WORDCOUNT_TEXT = (EXAMPLES / "wordcount.toml").read_text()


def wordcount(tmp_path: Path, old: str | None = None, new: str = "", *, name: str = "wc.toml") -> Path:
    """examples/wordcount.toml with ``old`` replaced by ``new``, written next
    to nothing (commands are not started here)."""
    text = WORDCOUNT_TEXT
    if old is not None:
        assert old in text, old
        text = text.replace(old, new, 1)
    p = tmp_path / name
    p.write_text(text)
    return p


def builder() -> TopologyBuilder:
    b = TopologyBuilder()
    b.set_spout("src", PythonSpout([["a b"]], fields=["line"]))
    b.set_bolt("b", PythonBolt(lambda v: [v], fields=["word"])).shuffle_grouping("src")
    return b


# --- TOML typos: named, with a suggestion -----------------------------------------------------


@pytest.mark.parametrize("old, new, pattern", [
    ('grouping = "fields"', 'groupping = "fields"',
     r"wc\.toml: bolt 'count': input #1: unknown key 'groupping'; did you mean 'grouping'\?"),
    ('name = "wordcount"', 'name = "wordcount"\nnmae = "x"',
     r"wc\.toml: \[topology\]: unknown key 'nmae'; did you mean 'name'\?"),
    ('name = "wordcount"', 'name = "wordcount"\nworkers = 2', r"\[topology\]: unknown key 'workers'; allowed"),
    ("[topology.conf]", "[topology.cnf]", r"\[topology\]: unknown key 'cnf'; did you mean 'conf'\?"),
    ('key = ["word"]', 'keys = ["word"]', r"wc\.toml: \[output\]: unknown key 'keys'; did you mean 'key'\?"),
    ("[output]", "[outptu]", r"wc\.toml: unknown top-level table 'outptu'; did you mean 'output'\?"),
    ("[bolts.split]\ncommand", "[bolts.split]\ncomand = 1\ncommand",
     r"bolt 'split': unknown key 'comand'; did you mean 'command'\?"),
    ('source = "split"', 'sourc = "split"', r"input #1: unknown key 'sourc'; did you mean 'source'\?"),
    ('grouping = "fields"', 'grouping = "feilds"', r"unknown grouping 'feilds'; did you mean 'fields'\?"),
])
def test_toml_typos_are_named_with_a_suggestion(tmp_path, old, new, pattern):
    with pytest.raises(TopologyError, match=pattern):
        load_topology(wordcount(tmp_path, old, new))


@pytest.mark.parametrize("old, new, pattern", [
    # A string is never split into characters.
    ('fields = ["word"] }', 'fields = "word" }',
     r"bolt 'count': input #1: fields must be a list of field names, e\.g\. \[\"word\"\], got 'word'"),
    ('fields = ["word", "count"]', 'fields = "word"', r"bolt 'count': fields must be a list of field names"),
    ('key = ["word"]', 'key = "word"', r"\[output\] key must be a list of field names.*got 'word'"),
    ('command = ["node", "node/count_bolt.js"]', 'command = "node node/count_bolt.js"',
     r"bolt 'count': command must be a non-empty list of strings"),
    ('command = ["node", "node/count_bolt.js"]', "command = []", r"bolt 'count': command must be"),
    ('command = ["node", "node/count_bolt.js"]', 'command = ["node", 1]', r"bolt 'count': command must be"),
    ('fields = ["word", "count"]', 'streams = { default = "word" }', r"bolt 'count': streams must be a table"),
    ('fields = ["word", "count"]', 'streams = ["word"]', r"bolt 'count': streams must be a table"),
    ("parallelism = 2\ninputs = [{ source = \"split\"", "parallelism = true\ninputs = [{ source = \"split\"",
     r"bolt 'count': parallelism must be a positive integer, got True"),
    ("parallelism = 2\ninputs = [{ source = \"split\"", "parallelism = 1.5\ninputs = [{ source = \"split\"",
     r"bolt 'count': parallelism must be a positive integer, got 1\.5"),
    ("parallelism = 2\ninputs = [{ source = \"split\"", "parallelism = -3\ninputs = [{ source = \"split\"",
     r"bolt 'count': parallelism must be a positive integer, got -3"),
    ("parallelism = 2\ninputs = [{ source = \"split\"",
     "parallelism = 9223372036854775807\ninputs = [{ source = \"split\"", r"bolt 'count': parallelism must be at most"),
    ('conf = { "multilang.hold.emits.until.ack" = true }', 'conf = "hold"', r"bolt 'split': conf must be a table"),
    ('conf = { "multilang.hold.emits.until.ack" = true }', "env = { LANG = 1 }",
     r"bolt 'split': env must be a table of NAME = \"value\" strings"),
    ('conf = { "multilang.hold.emits.until.ack" = true }', 'env = "LANG=C"', r"bolt 'split': env must be a table"),
    ('conf = { "multilang.hold.emits.until.ack" = true }', "cwd = 5", r"bolt 'split': cwd must be a string"),
    ('name = "wordcount"', "name = 5", r"\[topology\] name must be a non-empty string, got 5"),
    ('inputs = [{ source = "split"', 'inputs = "split"\nx = [{ source = "split"', r"unknown key 'x'"),
    ('inputs = [{ source = "split", grouping = "fields", fields = ["word"] }]', 'inputs = "split"',
     r"bolt 'count': inputs must be a list"),
    ('inputs = [{ source = "split", grouping = "fields", fields = ["word"] }]', 'inputs = ["split"]',
     r"bolt 'count': input #1: must be a table"),
    ('source = "split"', "source = 1", r"input #1: source must be a string, got 1"),
    ('grouping = "shuffle"', 'grouping = "shuffle", fields = ["sentence"]',
     r"bolt 'split': input from 'sentences': fields \['sentence'\] apply to the fields grouping only"),
    ("[output]\ncomponent = \"count\"", "[output]\ncomponent = [\"count\"]", r"\[output\] component must be a string"),
    ('"topology.max.spout.pending" = 200', '"multilang.output.component" = "count"',
     r"\[topology\.conf\]: conf key 'multilang\.output\.component' applies to Flux YAML files only"),
    # unquoted, TOML makes tables of a dotted key: said, not ignored (nor its bad value let through)
    ('"topology.max.spout.pending" = 200', "topology.max.spout.pending = 200",
     r"conf key 'topology' is a table, not the dotted key 'topology\.max\.spout\.pending'.*"
     r"\(\"topology\.max\.spout\.pending\" = 200 in TOML"),
    ('"topology.max.spout.pending" = 200', 'topology.message.timeout.secs = "abc"',
     r"not the dotted key 'topology\.message\.timeout\.secs'"),
    ('conf = { "multilang.hold.emits.until.ack" = true }', "conf = { multilang.hold.emits.until.ack = true }",
     r"bolt 'split'.*conf key 'multilang' is a table, not the dotted key 'multilang\.hold\.emits\.until\.ack'"),
    ('fields = ["word"]\nparallelism = 2', 'fields = ["word", ""]\nparallelism = 2',
     r"wc\.toml: bolt 'split': fields: field names must be non-empty strings, got \['word', ''\]"),
    ('fields = ["word"] }', 'fields = [""] }', r"bolt 'count': input from 'split': fields: field names must be"),
    ('key = ["word"]', 'key = [""]', r"output: key: field names must be non-empty"),
    ("[bolts.split]", "[bolts.sentences]",
     r"wc\.toml: component 'sentences' is defined twice: as a spout \(\[spouts\.sentences\]\) and as a bolt "
     r"\(\[bolts\.sentences\]\)"),
])
def test_toml_wrong_types_are_named(tmp_path, old, new, pattern):
    with pytest.raises(TopologyError, match=pattern) as info:
        load_topology(wordcount(tmp_path, old, new))
    assert str(info.value).startswith(str(tmp_path / "wc.toml") + ": ")


def test_toml_top_level_tables_must_be_tables(tmp_path):
    p = tmp_path / "t.toml"
    p.write_text('topology = "wc"\n[spouts.s]\ncommand = ["python", "s.py"]\nfields = ["x"]\n')
    with pytest.raises(TopologyError, match=r"t\.toml: \[topology\]: must be a table, got 'wc'"):
        load_topology(p)


def test_the_valid_example_still_loads_with_the_new_key(tmp_path):
    topo = load_topology(EXAMPLES / "wordcount.toml")
    assert topo.conf["multilang.max.replays"] == 3
    assert topo.source == str(EXAMPLES / "wordcount.toml")


# --- conf values ----------------------------------------------------------------------------

#: For every key of the schema: values it must refuse and values it accepts.
BAD_GOOD: dict[str, tuple[list, list]] = {
    "topology.message.timeout.secs": ([0, -1, "30", None, True, math.nan, math.inf, 10**400], [30, 0.5]),
    "topology.max.spout.pending": ([0, -1, "abc", 1.5, True, [200]], [None, 1, 200]),
    "topology.acker.executors": ([-1, "0", 1.0, False], [None, 0, 1, 4]),
    "topology.workers": ([0, -1, "2", 1.5, True, None], [1, 2, 16]),
    "topology.shellbolt.max.pending": ([0, -5, None, "100", True], [1, 100]),
    "topology.producer.batch.size": ([0, -3, None, "100", 2.5, True], [1, 100, 1000]),
    "topology.subprocess.timeout.secs": ([0, -2, "2", False, math.nan], [None, 2, 0.1]),
    "supervisor.worker.timeout.secs": ([0, -30, None, "30"], [30]),
    "topology.tick.tuple.freq.secs": ([0, -1, "1", True, {}], [None, 1, 0.5]),
    "topology.name": ([1, None, ["wc"]], ["wc"]),
    "multilang.max.frame.bytes": ([0, -1, 1.5, "64M", True], [100, 64 << 20]),
    "multilang.handshake.timeout.secs": ([0, -1, "30", None], [1, 30]),
    "multilang.heartbeat.interval.secs": ([0, -0.5, "1", True], [0.2, 1]),
    "multilang.restart.budget": ([-1, 1.0, "5", True, None], [0, 5, 1_000_000]),
    "multilang.restart.window.secs": ([0, -60, "60", None], [60, 0.5]),
    "multilang.shutdown.grace.secs": ([-1, "5", None, True, math.inf], [0, 0.2, 5]),
    "multilang.kill.grace.secs": ([-0.1, "2", None, False], [0, 0.5, 2]),
    "multilang.progress.stall.secs": ([0, -1, "5", None, True, math.inf], [5, 0.5]),
    "multilang.spout.start.secs": ([-1, "1", None, True, math.inf, math.nan], [0, 0.2, 5, 30]),
    "multilang.hold.emits.until.ack": ([1, 0, "true", None], [True, False]),
    "multilang.sched.batch": ([1, 0, "false", None], [True, False]),
    "multilang.extensions": (["batch", ["zip"], ["batch", "batch"], [1], None, {"batch": True}],
                             [[], ["batch"], ["batch", "msgpack"], ["msgpack"], ["batch", "state"]]),
    "topology.state.checkpoint.interval.ms": ([0, -1, 1.5, "1000", True, None], [1, 1000]),
    "topology.state.provider": (["redis", "org.apache.storm.redis.state.RedisKeyValueStateProvider", ":x", "m:",
                                 "a:b:c", 1, None, ["sqlite"]], ["sqlite", "memory", "mystore:RedisStore"]),
    "topology.state.provider.config": ([1, "not json", "[1]", ["dir"], True], [None, {}, {"dir": "state"},
                                                                              '{"dir": "state"}']),
    "multilang.max.replays": ([-1, 1.5, "3", True, None], [0, 3, 100]),
    "multilang.record.segment.bytes": ([4095, 0, -1, 1.5, "16M", True, None], [4096, 16 << 20]),
    "multilang.record.segments": ([0, -1, 1.5, "4", True, None], [1, 4, 100]),
    "multilang.spark.max.tuples.per.trigger": ([0, -5, 1.5, "100", True, None], [1, 5000]),
    "multilang.spark.max.trigger.delay.ms": ([0, -1, 2.5, "2000", False, None], [1, 2000]),
    "topology.metrics.consumer.register": (
        ["json", {"class": "json", "argument": "m"}, [{"class": "LoggingMetricsConsumer"}], [{"class": "json"}],
         [{"class": "json", "argument": ""}], [{"class": "prometheus", "argument": 65536}],
         [{"class": "prometheus", "argument": True}], [{"class": "prometheus", "argument": "9464"}],
         [{"class": "json", "argument": "m", "port": 1}]],
        [None, [], [{"class": "json", "argument": "metrics.jsonl"}], [{"class": "prometheus", "argument": 9464}],
         [{"class": "prometheus", "argument": "0.0.0.0:9464", "parallelism.hint": 1}]]),
    "topology.builtin.metrics.bucket.size.secs": ([0, -1, "10", None, True, math.inf], [10, 0.5, 60]),
    "multilang.resource.dir": ([1, [".."], True], [None, "..", "resources"]),
    "multilang.output.component": ([None, ["c"], 1.5, True], ["count", 1]),
    "multilang.output.stream": ([None, ["s"], {}], ["default"]),
    "multilang.output.key": (["word", [1], None], [[], ["word"]]),
    "multilang.testwordspout.count": ([-1, "10", 1.5, True], [0, 1000]),
    "multilang.testwordspout.seed": ([[1], {}, True, math.nan], [None, 1, "s"]),
}


def test_every_schema_key_has_bad_and_good_values_tested():
    assert set(BAD_GOOD) == set(SCHEMA)


def test_default_conf_is_the_schemas_defaults_and_each_is_valid():
    # DEFAULT_CONF is built from SCHEMA: every key the runtime reads, with a default its own check accepts.
    assert set(DEFAULT_CONF) == {k for k, spec in SCHEMA.items() if not spec.flux} - {"topology.name"}
    for key, value in DEFAULT_CONF.items():
        assert check_value(key, value) is None, key
    assert DEFAULT_CONF["multilang.max.replays"] == 3
    assert DEFAULT_CONF["topology.shellbolt.max.pending"] == 100 and DEFAULT_CONF["multilang.extensions"] == ["batch", "state"]
    assert DEFAULT_CONF["multilang.extensions"] is not SCHEMA["multilang.extensions"].default, "a copy"


@pytest.mark.parametrize("key, bad", [(k, v) for k, (bads, _) in BAD_GOOD.items() for v in bads],
                         ids=lambda x: repr(x)[:30])
def test_bad_conf_values_are_refused_naming_the_key(key, bad):
    cause = check_value(key, bad)
    assert cause is not None and cause.startswith(f"conf key {key!r} must be ") and ", got " in cause
    if SCHEMA[key].flux:
        return  # not read from a TOML/builder topology; refused by the Flux loader (below)
    # Topology conf, through the builder.
    with pytest.raises(TopologyError, match=f"conf key '{key}' must be .*, got"):
        builder().create_topology({key: bad})
    # A component's own conf.
    b = TopologyBuilder()
    b.set_spout("src", PythonSpout([["x"]], fields=["line"]), conf={key: bad})
    with pytest.raises(TopologyError, match=f"spout 'src': conf key '{key}' must be"):
        b.create_topology()


@pytest.mark.parametrize("key, good", [(k, v) for k, (_, goods) in BAD_GOOD.items() for v in goods],
                         ids=lambda x: repr(x)[:30])
def test_good_conf_values_are_accepted(key, good):
    assert check_value(key, good) is None
    if not SCHEMA[key].flux:
        assert builder().create_topology({key: good}).conf[key] == good


def test_the_error_names_file_component_key_and_cause(tmp_path):
    p = wordcount(tmp_path, '[bolts.count]\ncommand = ["node", "node/count_bolt.js"]',
                  '[bolts.count]\nconf = { "topology.max.spout.pending" = "abc" }\n'
                  'command = ["node", "node/count_bolt.js"]')
    with pytest.raises(TopologyError) as info:
        load_topology(p)
    assert str(info.value) == (f"{p}: bolt 'count': conf key 'topology.max.spout.pending' must be a positive "
                               f"integer or null, got 'abc'")


@pytest.mark.parametrize("value", ['"abc"', "0", "-1", "true", "1.5"])
def test_toml_topology_conf_max_spout_pending(tmp_path, value):
    p = wordcount(tmp_path, '"topology.max.spout.pending" = 200', f'"topology.max.spout.pending" = {value}')
    with pytest.raises(TopologyError, match=rf"wc\.toml: conf key 'topology\.max\.spout\.pending' must be a "
                                            rf"positive integer or null"):
        load_topology(p)


def test_overrides_are_checked_and_named(tmp_path):
    with pytest.raises(TopologyError, match=r"wc\.toml: conf overrides: conf key 'topology\.shellbolt\.max\.pending' "
                                            r"must be a positive integer, got -1"):
        load_topology(wordcount(tmp_path), {"topology.shellbolt.max.pending": -1})


def test_bool_is_not_a_number():
    for key in ("topology.max.spout.pending", "topology.message.timeout.secs", "multilang.restart.budget",
                "multilang.max.replays", "topology.acker.executors"):
        assert check_value(key, True).endswith("got true (a boolean)")  # (as the file spells it, not Python)
    assert check_value("topology.workers", None).endswith("got null")


def test_conf_must_be_a_mapping_with_string_keys():
    with pytest.raises(TopologyError, match="conf must be a mapping"):
        builder().create_topology(["topology.debug"])  # type: ignore[arg-type]
    with pytest.raises(TopologyError, match="conf keys must be strings, got 1"):
        builder().create_topology({1: 2})  # type: ignore[dict-item]


# --- unknown keys pass through --------------------------------------------------------------


def test_unknown_storm_key_passes_through_silently(caplog):
    caplog.set_level(logging.WARNING, logger="multilang.shellbolt")
    topo = builder().create_topology({"topology.workers": 4, "my.bolt.setting": {"x": [1]}})
    assert topo.conf_for("b")["my.bolt.setting"] == {"x": [1]}
    assert topo.conf["topology.workers"] == 4
    assert not [r for r in caplog.records if r.name == "multilang.shellbolt"]


@pytest.mark.parametrize("typo, meant", [
    ("topology.max.spout.pendng", "topology.max.spout.pending"),        # a deletion
    ("topology.max.spuot.pending", "topology.max.spout.pending"),       # a swap
    ("topology.max_spout_pending", "topology.max.spout.pending"),       # separators
    ("Topology.Message.Timeout.Secs", "topology.message.timeout.secs"),  # case
    ("max.spout.pending", "topology.max.spout.pending"),                # the prefix left out
    ("multilang.max.replay", "multilang.max.replays"),
    ("multilang.extension", "multilang.extensions"),
])
def test_near_miss_passes_through_with_a_warning(caplog, typo, meant):
    caplog.set_level(logging.WARNING, logger="multilang.shellbolt")
    topo = builder().create_topology({typo: 5})
    assert topo.conf[typo] == 5  # still passed on: a component may read it
    assert topo.conf[meant] == DEFAULT_CONF.get(meant)
    msgs = [r.getMessage() for r in caplog.records if r.name == "multilang.shellbolt"]
    assert len(msgs) == 1 and f"{typo!r}" in msgs[0] and f"did you mean {meant!r}" in msgs[0]
    assert caplog.records[0].levelno == logging.WARNING


def test_near_miss_in_a_component_conf_names_file_and_component(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="multilang.shellbolt")
    p = wordcount(tmp_path, '"multilang.hold.emits.until.ack" = true', '"multilang.hold.emit.until.ack" = true')
    load_topology(p)
    [msg] = [r.getMessage() for r in caplog.records if r.name == "multilang.shellbolt"]
    assert msg.startswith(f"{p}: bolt 'split': conf key 'multilang.hold.emit.until.ack'")
    assert "did you mean 'multilang.hold.emits.until.ack'" in msg


def test_near_miss_in_a_conf_override_warns_once(tmp_path, caplog):
    # checked as an override (its values, named as such) and in the whole conf: warned once
    caplog.set_level(logging.WARNING, logger="multilang.shellbolt")
    load_topology(wordcount(tmp_path), {"topology.message.timeout.sec": 5})
    msgs = [r.getMessage() for r in caplog.records if r.name == "multilang.shellbolt" and "did you mean" in r.getMessage()]
    assert len(msgs) == 1 and "'topology.message.timeout.sec'" in msgs[0], msgs


def test_topology_only_key_in_a_component_conf_warns(caplog):
    caplog.set_level(logging.WARNING, logger="multilang.shellbolt")
    b = TopologyBuilder()
    b.set_spout("src", PythonSpout([["x"]], fields=["line"]), conf={"topology.max.spout.pending": 5})
    b.create_topology()
    [msg] = [r.getMessage() for r in caplog.records if r.name == "multilang.shellbolt"]
    assert "spout 'src'" in msg and "read from the topology conf only" in msg


def test_near_miss_rules():
    assert near_miss("groupping", "grouping") and near_miss("keys", "key") and near_miss("cnf", "conf")
    assert not near_miss("topology.workers", "topology.max.spout.pending")
    assert not near_miss("grouping", "grouping")
    assert suggest("paralelism", ["parallelism", "fields"]) == "parallelism"
    assert suggest("zzz", ["parallelism", "fields"]) is None


# --- the Python builder gets the same checks --------------------------------------------------


@pytest.mark.parametrize("make, pattern", [
    (lambda: ShellSpout(["python", "s.py"], fields="line"), r"spout 'src': fields must be a list of field names"),
    (lambda: ShellSpout("python s.py", fields=["line"]), r"spout 'src': command must be a non-empty list"),
    (lambda: ShellSpout(["python", "s.py"], fields=["line"], env={"A": 1}), r"spout 'src': env must be a table"),
    (lambda: ShellSpout(["python", "s.py"], fields=["line"], env=["A=1"]), r"spout 'src': env must be a table"),
    (lambda: ShellSpout(["python", "s.py"], fields=["line"], cwd=3), r"spout 'src': cwd must be a string"),
    (lambda: ShellSpout(["python", "s.py"], streams={"s": "line"}), r"spout 'src': stream 's': fields must be"),
    (lambda: ShellSpout(["python", "s.py"], streams=["line"]), r"spout 'src': streams must be a table"),
    (lambda: PythonSpout(5, fields=["line"]), r"spout 'src': a PythonSpout needs an iterable"),
])
def test_builder_component_types(make, pattern):
    b = TopologyBuilder()
    b.set_spout("src", make())
    with pytest.raises(TopologyError, match=pattern):
        b.create_topology()


def test_builder_fields_grouping_with_a_string_is_refused_not_split():
    b = TopologyBuilder()
    b.set_spout("src", PythonSpout([["a"]], fields=["word"]))
    b.set_bolt("b", PythonBolt(lambda v: [v], fields=["w"])).fields_grouping("src", "word")
    with pytest.raises(TopologyError, match=r"bolt 'b': input from 'src': fields must be a list of field names, "
                                            r"got 'word'"):
        b.create_topology()


def test_builder_python_bolt_needs_a_function_and_component_conf_a_mapping():
    b = TopologyBuilder()
    b.set_spout("src", PythonSpout([["a"]], fields=["word"]))
    b.set_bolt("b", PythonBolt("upper", fields=["w"])).shuffle_grouping("src")  # type: ignore[arg-type]
    with pytest.raises(TopologyError, match=r"bolt 'b': a PythonBolt needs a function"):
        b.create_topology()
    b = TopologyBuilder()
    b.set_spout("src", PythonSpout([["a"]], fields=["word"]), conf="x")  # type: ignore[arg-type]
    with pytest.raises(TopologyError, match=r"spout 'src': conf must be a table"):
        b.create_topology()


def test_builder_output_types():
    from multilang.shellbolt._model.topology import OutputSpec

    with pytest.raises(TopologyError, match=r"output: key must be a list of field names, got 'word'"):
        builder().create_topology(output=OutputSpec("b", None, "word"))  # type: ignore[arg-type]


# --- Flux YAML ------------------------------------------------------------------------------

FLUX = """\
name: "flux-wc"
config:
  topology.workers: 1
  topology.max.spout.pending: 20
spouts:
  - id: "words"
    className: "org.apache.storm.testing.TestWordSpout"
    parallelism: 1
bolts:
  - id: "split"
    className: "org.apache.storm.flux.wrappers.bolts.FluxShellBolt"
    constructorArgs:
      - ["python", "split.py"]
      - ["word"]
    configMethods:
      - name: "addComponentConfig"
        args: ["multilang.hold.emits.until.ack", true]
    parallelism: 2
streams:
  - name: "words --> split"
    from: "words"
    to: "split"
    grouping:
      type: FIELDS
      args: ["word"]
"""


def flux(tmp_path: Path, old: str | None = None, new: str = "") -> Path:
    text = FLUX
    if old is not None:
        assert old in text, old
        text = text.replace(old, new, 1)
    p = tmp_path / "wc.yaml"
    p.write_text(text)
    return p


def test_flux_base_is_valid(tmp_path):
    topo = load_flux(flux(tmp_path))
    assert topo.conf_for("split")["multilang.hold.emits.until.ack"] is True


@pytest.mark.parametrize("old, new, pattern", [
    ('name: "flux-wc"', 'nmae: "flux-wc"', r"wc\.yaml: unknown key 'nmae'; did you mean 'name'\?"),
    ("config:", "confg:", r"wc\.yaml: unknown key 'confg'; did you mean 'config'\?"),
    ("    parallelism: 2", "    paralelism: 2", r"wc\.yaml: bolt 'split': unknown key 'paralelism'; did you mean"),
    ("    className: \"org.apache.storm.testing", "    classname: \"org.apache.storm.testing",
     r"spout 'words': unknown key 'classname'; did you mean 'className'\?"),
    ('    from: "words"', '    form: "words"', r"stream 'words --> split': unknown key 'form'; did you mean 'from'\?"),
    ('    to: "split"', '    to: "splt"', r"'to: splt' is not the id of a spout or bolt.*did you mean 'split'\?"),
    ("      args: [\"word\"]", "      arg: [\"word\"]", r"grouping: unknown key 'arg'; did you mean 'args'\?"),
    ("type: FIELDS", "type: FEILDS", r"unknown grouping type 'FEILDS'; did you mean 'FIELDS'\?"),
    ("        args: [\"multilang", "        arg: [\"multilang",
     r"configMethod 'addComponentConfig': unknown key 'arg'; did you mean 'args'\?"),
])
def test_flux_typos(tmp_path, old, new, pattern):
    with pytest.raises(TopologyError, match=pattern):
        load_flux(flux(tmp_path, old, new))


@pytest.mark.parametrize("old, new, pattern", [
    ("topology.max.spout.pending: 20", "topology.max.spout.pending: abc",
     r"wc\.yaml: conf key 'topology\.max\.spout\.pending' must be a positive integer or null, got 'abc'"),
    ("topology.max.spout.pending: 20", "topology.max.spout.pending: 0", r"wc\.yaml: conf key 'topology\.max"),
    ("topology.max.spout.pending: 20", "topology.message.timeout.secs: -1",
     r"wc\.yaml: conf key 'topology\.message\.timeout\.secs' must be a positive number"),
    ('args: ["multilang.hold.emits.until.ack", true]', 'args: ["multilang.hold.emits.until.ack", "yes"]',
     r"wc\.yaml: bolt 'split': conf key 'multilang\.hold\.emits\.until\.ack' must be true or false, got 'yes'"),
    ("    parallelism: 2", "    parallelism: 2\n    config: {topology.shellbolt.max.pending: -1}",
     r"wc\.yaml: bolt 'split': conf key 'topology\.shellbolt\.max\.pending' must be a positive integer"),
    ("    parallelism: 2", "    parallelism: 2\n    config: [1]", r"bolt 'split': config must be a mapping"),
    ("    parallelism: 2", "    parallelism: 2\n    numTasks: 0", r"bolt 'split': numTasks must be a positive"),
    ("    parallelism: 2", "    parallelism: two", r"bolt 'split': parallelism must be a positive integer"),
    # Types are checked, never coerced, as in TOML.
    ("    parallelism: 2", '    parallelism: "2"',
     r"wc\.yaml: bolt 'split': parallelism must be a positive integer, got '2' \(a string: drop the quotes\)"),
    ("    parallelism: 1", "    parallelism: 1.0", r"spout 'words': parallelism must be a positive integer, got 1\.0"),
    ("    parallelism: 1", "    parallelism: true", r"spout 'words': parallelism must be a positive integer, got True"),
    ('name: "flux-wc"', "name: 5", r"wc\.yaml: name must be a non-empty string, got 5"),
    ('name: "flux-wc"', "name: 5.5", r"wc\.yaml: name must be a non-empty string, got 5\.5"),
    ('      - ["word"]', '      - ["word", ""]',
     r"wc\.yaml: bolt 'split': fields: field names must be non-empty strings, got \['word', ''\]"),
    ("      args: [\"word\"]", "      args: [\"\"]", r"bolt 'split': input from 'words': fields: field names must be"),
    ("  topology.workers: 1\n  topology.max.spout.pending: 20", "  - 1",
     r"wc\.yaml: config \(a mapping of topology conf keys\) must be a mapping"),
    ("topology.workers: 1", "multilang.output.key: word", r"conf key 'multilang\.output\.key' must be a list"),
    ("topology.workers: 1", "multilang.testwordspout.count: -5", r"conf key 'multilang\.testwordspout\.count'"),
    ("topology.workers: 1", "multilang.resource.dir: [1]", r"conf key 'multilang\.resource\.dir' must be a string"),
    ('    className: "org.apache.storm.flux.wrappers.bolts.FluxShellBolt"', "    className: [x]",
     r"bolt 'split': needs a 'className' \(a string\)"),
    ('    from: "words"', "    from: [words]", r"'from: \['words'\]' is not the id of a spout or bolt"),
    ('      type: FIELDS\n      args: ["word"]', "      type: SHUFFLE\n      streamId: [x]", r"streamId must be a string"),
    ("      type: FIELDS", "      type: SHUFFLE", r"stream 'words --> split': args \['word'\] apply to the FIELDS "
     r"grouping only, not SHUFFLE"),
    ("      type: FIELDS", "      type: CUSTOM\n      customClass: x",
     r"CUSTOM grouping \(customClass names no className\) is a Java class"),
    ('streams:\n  - name: "words --> split"\n    from: "words"\n    to: "split"\n    grouping:\n      type: FIELDS\n'
     '      args: ["word"]\n', "",
     r"bolt 'split': has no inputs; add one under streams:, e\.g\. - \{from: 'words', to: 'split', grouping: "
     r"\{type: SHUFFLE\}\}$"),
    ("streams:", "streams: 5\nx:", r"unknown key 'x'"),
    ("  topology.workers: 1\n  topology.max.spout.pending: 20", "  topology:\n    max.spout.pending: 5",
     r"conf key 'topology' is a table, not the dotted key 'topology\.max\.spout\.pending'.*"
     r"topology\.max\.spout\.pending: 5 in YAML"),
    ("bolts:", "bolts: {a: 1}\nbolts2:", r"unknown key 'bolts2'"),
])
def test_flux_wrong_values(tmp_path, old, new, pattern):
    with pytest.raises(TopologyError, match=pattern) as info:
        load_flux(flux(tmp_path, old, new))
    assert str(info.value).startswith(str(tmp_path / "wc.yaml"))


def test_flux_bad_sections(tmp_path):
    for text, pattern in [
        (FLUX + "components: {a: 1}\n", r"components must be a list"),
        (FLUX.replace("bolts:", "bolts: 3\nxbolts:"), r"unknown key 'xbolts'"),
        ("topologySource: java.Main\n", r"topologySource java\.Main builds the topology in Java"),
        ("includes:\n  - {file: x.yaml, overide: true}\n", r"include 'x\.yaml': unknown key 'overide'; did you mean"),
        ("includes:\n  - {file: x.yaml, override: yes please}\n", r"override must be true or false"),
        ("name: [a]\n" + FLUX.split("\n", 1)[1], r"name must be a non-empty string"),
    ]:
        p = tmp_path / "bad.yaml"
        p.write_text(text)
        with pytest.raises(TopologyError, match=pattern):
            load_flux(p)


def test_flux_unknown_conf_key_near_miss_warns(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="multilang.shellbolt")
    topo = load_flux(flux(tmp_path, "topology.max.spout.pending: 20", "topology.max.spout.pendin: 20"))
    assert topo.conf["topology.max.spout.pendin"] == 20
    [msg] = [r.getMessage() for r in caplog.records if r.name == "multilang.shellbolt"]
    assert "wc.yaml" in msg and "did you mean 'topology.max.spout.pending'" in msg


def test_flux_examples_still_load():
    for p in sorted((EXAMPLES / "flux").glob("*.yaml")):
        if p.name != "filtered.yaml":  # needs properties and env (tests/integration/test_flux.py)
            load_flux(p)


# --- the CLI ---------------------------------------------------------------------------------


def _cli(*args: str):
    return CliRunner().invoke(cli_main, list(args))


@pytest.mark.parametrize("conf", [
    "topology.max.spout.pending=abc", "topology.max.spout.pending=0", "topology.max.spout.pending=-1",
    "topology.shellbolt.max.pending=-1", "topology.subprocess.timeout.secs=-3",
    'topology.message.timeout.secs="30"', "multilang.extensions=batch", "multilang.max.replays=true",
    "topology.tick.tuple.freq.secs=NaN",
])
def test_cli_bad_conf_override_is_a_usage_error(conf):
    result = _cli("run", str(EXAMPLES / "wordcount.toml"), "-c", conf, "--no-progress")
    assert result.exit_code == 2, result.output
    assert "error: " in result.output and "conf overrides: conf key" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize("key", ["multilang.output.key", "multilang.output.component", "multilang.resource.dir"])
def test_flux_only_key_in_toml_overrides_is_named_as_an_override(tmp_path, key):
    """A -c override is not in [topology.conf]: say where it really came from."""
    p = wordcount(tmp_path)
    with pytest.raises(TopologyError, match=rf"^{re.escape(str(p))}: conf overrides: conf key {re.escape(repr(key))} "
                                            r"applies to Flux YAML files only"):
        load_topology(p, {key: ["word"] if key.endswith("key") else "x"})
    # ...while the same key in the file is still named as the file's.
    with pytest.raises(TopologyError, match=r"wc\.toml: \[topology\.conf\]: conf key"):
        load_topology(wordcount(tmp_path, '"topology.max.spout.pending" = 200', f'"{key}" = "x"'),
                      {"topology.max.spout.pending": 3})


def test_cli_flux_only_key_override_on_toml_says_conf_overrides():
    result = _cli("run", str(EXAMPLES / "wordcount.toml"), "-c", 'multilang.output.key=["word"]', "--no-progress")
    assert result.exit_code == 2, result.output
    assert "error: " in result.output and "wordcount.toml: conf overrides: conf key 'multilang.output.key'" in \
        result.output and "[topology.conf]" not in result.output


def test_flux_bad_override_is_named_as_an_override(tmp_path):
    p = flux(tmp_path)
    for key, value in [("multilang.output.key", "word"), ("topology.max.spout.pending", 0)]:
        with pytest.raises(TopologyError, match=rf"^{re.escape(str(p))}: conf overrides: conf key "
                                                rf"{re.escape(repr(key))} must be"):
            load_flux(p, overrides={key: value})


def test_cli_toml_missing_cwd_is_a_usage_error_naming_file_component_and_key(tmp_path):
    """Exit 2 up front, not exit 1 after a restart loop of "No such file or directory"."""
    p = tmp_path / "wc.toml"
    p.write_text(WORDCOUNT_TEXT.replace("[bolts.count]\n", '[bolts.count]\ncwd = "nonexistent_dir"\n')
                 .replace('command = ["', 'command = ["python", "'))  # on PATH wherever the test runs
    result = _cli("run", str(p), "--no-progress")
    assert result.exit_code == 2, result.output
    assert f"error: {p}: bolt 'count': cwd 'nonexistent_dir' does not exist" in result.output


@pytest.mark.parametrize("args", [("--duration", "-1"), ("--duration", "0"), ("--max-tuples", "0"),
                                  ("--max-tuples", "-5")])
def test_cli_duration_and_max_tuples_must_be_positive(args):
    result = _cli("run", str(EXAMPLES / "wordcount.toml"), *args)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{args[0]}'" in result.output


# --- fuzz: malformed topology files -----------------------------------------------------------

# (the generator: tests/integration/topology_fuzz.py, shared with the real-CLI sample there)


FUZZ_CASES = 2000


def test_fuzz_malformed_files_give_a_topology_error_or_load(tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="multilang.shellbolt")
    outcomes = {"ok": 0, "error": 0}
    for seed in range(FUZZ_CASES):
        p = tmp_path / f"m{seed}.toml"
        p.write_text(mutant(seed))
        try:
            outcomes["ok" if check(p) is None else "error"] += 1
        except TopologyError:
            raise
        except Exception as exc:  # noqa: BLE001 - the point of the test
            pytest.fail(f"seed {seed}: {type(exc).__name__}: {exc}\n{p.read_text()}")
    # Both kinds occur (the generator is not degenerate).
    assert outcomes["error"] > FUZZ_CASES // 2 and outcomes["ok"] > 10, outcomes


def test_every_conf_key_is_documented():
    doc = (ROOT / "docs" / "CONF.md").read_text()
    missing = [k for k in SCHEMA if f"| `{k}` | {SCHEMA[k].what} |" not in doc]
    assert not missing, f"docs/CONF.md lacks (or has a stale type for) {missing}"


@pytest.mark.parametrize(("old", "new", "message"), [
    ('"node/count_bolt.js"', '"node/count_bolt2.js"', "bolt 'count': script 'node/count_bolt2.js' not found"),
    ('"ruby/split_bolt.rb"', '"ruby/splitbolt.rb"', "bolt 'split': script 'ruby/splitbolt.rb' not found"),
])
def test_cli_a_missing_script_is_a_usage_error_before_any_process_starts(tmp_path, old, new, message):
    """Exit 2 naming the script, not exit 1 after the restart budget of an interpreter that exits at once."""
    for entry in EXAMPLES.iterdir():  # the example's scripts, next to the file (commands run in its directory)
        (tmp_path / entry.name).symlink_to(entry)
    p = tmp_path / "wc.toml"
    p.write_text(WORDCOUNT_TEXT.replace(old, new))
    result = _cli("run", str(p), "--no-progress")
    assert result.exit_code == 2, result.output
    assert f"error: {p}: {message}" in result.output


@pytest.mark.parametrize(("mode", "message"), [
    (0o644, "bolt 'split': command './split.rb' is not executable (chmod +x it"),
    (None, "bolt 'split': command './split.rb' is a directory"),
])
def test_cli_a_command_that_cannot_be_executed_is_a_usage_error(tmp_path, mode, message):
    """Exit 2 at once, not a crash loop of 'Permission denied' ending in exit 1."""
    for entry in EXAMPLES.iterdir():
        (tmp_path / entry.name).symlink_to(entry)
    if mode is None:
        (tmp_path / "split.rb").mkdir()
    else:
        (tmp_path / "split.rb").write_text((EXAMPLES / "ruby" / "split_bolt.rb").read_text())
        (tmp_path / "split.rb").chmod(mode)
    p = tmp_path / "wc.toml"
    p.write_text(WORDCOUNT_TEXT.replace('["ruby", "ruby/split_bolt.rb"]', '["./split.rb"]'))
    result = _cli("run", str(p), "--no-progress")
    assert result.exit_code == 2, result.output
    assert f"error: {p}: {message}" in result.output
