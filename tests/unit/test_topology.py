"""TopologyBuilder, load_topology (TOML) and the handshake context (spec §2.2)."""

from __future__ import annotations

import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

from multilang import TopologyError
from multilang.shellbolt import (
    DEFAULT_CONF,
    PythonBolt,
    PythonSpout,
    ShellBolt,
    ShellSpout,
    TopologyBuilder,
    load_topology,
)

ROOT = Path(__file__).resolve().parents[2]
WORDCOUNT = ROOT / "examples" / "wordcount.toml"

CONTEXT_KEYS = {
    "task->component",
    "taskid",
    "componentid",
    "streams",
    "stream->outputfields",
    "stream->target->grouping",
    "source->stream->grouping",
    "source->stream->fields",
}


def spout(fields=("sentence",), **kw):
    return ShellSpout(["python", "spout.py"], fields=list(fields), **kw)


def bolt(fields=("word",), **kw):
    return ShellBolt(["python", "bolt.py"], fields=list(fields), **kw)


def basic_builder() -> TopologyBuilder:
    b = TopologyBuilder()
    b.set_spout("sentences", spout())
    b.set_bolt("split", bolt(), parallelism=2).shuffle_grouping("sentences")
    return b


# --- builder validation ---------------------------------------------------------------------


def test_valid_topology_builds():
    topo = basic_builder().create_topology({"topology.max.spout.pending": 7}, name="wc")
    assert topo.name == "wc"
    assert topo.conf["topology.max.spout.pending"] == 7
    # Defaults are filled in for every key the runtime honours.
    for k, v in DEFAULT_CONF.items():
        if k != "topology.max.spout.pending":
            assert topo.conf[k] == v


def test_unknown_source():
    b = basic_builder()
    b.set_bolt("count", bolt()).shuffle_grouping("splt")
    with pytest.raises(TopologyError, match=r"bolt 'count': input from unknown component 'splt'"):
        b.create_topology()


def test_undeclared_stream():
    b = basic_builder()
    b.set_bolt("count", bolt()).shuffle_grouping("split", stream="words")
    with pytest.raises(TopologyError) as ei:
        b.create_topology()
    msg = str(ei.value)
    assert "'count'" in msg and "'words'" in msg and "'split'" in msg and "default" in msg


def test_named_stream_subscription_is_valid():
    b = TopologyBuilder()
    b.set_spout("s", ShellSpout(["python", "s.py"], streams={"words": ["w"], "errors": ["e"]}))
    b.set_bolt("b", bolt()).shuffle_grouping("s", stream="errors").fields_grouping("s", ["w"], stream="words")
    topo = b.create_topology()
    assert [i.stream for i in topo.components["b"].inputs] == ["errors", "words"]


def test_fields_grouping_on_missing_field():
    b = basic_builder()
    b.set_bolt("count", bolt()).fields_grouping("split", ["wrod"])
    with pytest.raises(TopologyError) as ei:
        b.create_topology()
    msg = str(ei.value)
    assert "'count'" in msg and "wrod" in msg and "'word'" in msg


def test_fields_grouping_without_fields():
    b = basic_builder()
    b.set_bolt("count", bolt()).fields_grouping("split", [])
    with pytest.raises(TopologyError, match="needs at least one field"):
        b.create_topology()


@pytest.mark.parametrize("bad", [0, -1, "2", 1.5, True, None])
def test_bad_parallelism(bad):
    b = TopologyBuilder()
    b.set_spout("sentences", spout())
    b.set_bolt("split", bolt(), parallelism=bad).shuffle_grouping("sentences")
    with pytest.raises(TopologyError, match=r"bolt 'split': parallelism must be a positive integer, got"):
        b.create_topology()


def test_bad_spout_parallelism():
    b = TopologyBuilder()
    b.set_spout("sentences", spout(), parallelism=0)
    with pytest.raises(TopologyError, match=r"spout 'sentences': parallelism"):
        b.create_topology()


def test_duplicate_component():
    b = basic_builder()
    with pytest.raises(TopologyError, match=r"'split' is defined twice: as two bolts; ids must be unique"):
        b.set_bolt("split", bolt())
    with pytest.raises(TopologyError, match=r"'sentences' is defined twice: as a spout and as a bolt"):
        b.set_bolt("sentences", bolt())


# --- reachability: every bolt is fed, directly or not, by a spout ------------------------------------


def test_bolt_subscribed_only_to_itself_is_refused():
    b = basic_builder()
    b.set_bolt("count", bolt()).shuffle_grouping("count")
    with pytest.raises(TopologyError) as info:
        b.create_topology()
    assert str(info.value) == ("bolt 'count' gets no input from any spout: its only inputs are ['count']; "
                               "subscribe it to a spout, or to a bolt that a spout feeds")


def test_a_source_stream_subscribed_twice_is_refused_not_delivered_twice():
    # Storm's builder keeps one grouping per (source, stream); two here would
    # deliver every tuple twice and double every count, silently.
    b = basic_builder()
    b.set_bolt("b", bolt()).shuffle_grouping("sentences").fields_grouping("sentences", ["sentence"])
    with pytest.raises(TopologyError, match=r"bolt 'b': subscribes to 'sentences'/default twice \(shuffle and fields "
                                            r"grouping\): each tuple would arrive twice"):
        b.create_topology()


def test_the_default_stream_declared_by_both_fields_and_streams_is_refused():
    b = TopologyBuilder()
    b.set_spout("src", ShellSpout(["python", "s.py"], fields=["sentence"], streams={"default": ["x", "y"]}))
    with pytest.raises(TopologyError, match=r"spout 'src': the default stream is declared twice, by fields "
                                            r"\['sentence'\] and by streams\.default \['x', 'y'\]; declare it once"):
        b.create_topology()


def test_bolts_feeding_only_each_other_are_refused_and_all_named():
    b = basic_builder()
    b.set_bolt("a", bolt()).shuffle_grouping("b")
    b.set_bolt("b", bolt()).shuffle_grouping("a")
    b.set_bolt("c", bolt()).shuffle_grouping("b")
    with pytest.raises(TopologyError, match=r"bolt 'a' gets no input from any spout: its only inputs are \['b'\], "
                                            r"which no spout reaches either \(also unreachable: \['b', 'c'\]\)"):
        b.create_topology()


def test_cycles_reachable_from_a_spout_are_allowed():
    """Storm allows cycles; a loop is fine as long as a spout feeds into it."""
    b = basic_builder()
    b.set_bolt("count", bolt(), parallelism=2).shuffle_grouping("split").shuffle_grouping("count")
    b.set_bolt("loop", bolt()).shuffle_grouping("loop").shuffle_grouping("count")
    topo = b.create_topology()
    assert sorted(topo.components) == ["count", "loop", "sentences", "split"]


def test_unconsumed_bolt_next_to_an_output_is_fine():
    from multilang.shellbolt import OutputSpec

    b = basic_builder()
    b.set_bolt("count", bolt(("word", "count"))).fields_grouping("split", ["word"])
    b.set_bolt("audit", bolt(("line",))).shuffle_grouping("sentences")  # nobody reads it
    topo = b.create_topology(output=OutputSpec("count", None, ["word"]))
    assert topo.output.component == "count"


def test_toml_bolt_subscribed_to_itself_names_the_file(tmp_path):
    text = WORDCOUNT.read_text().replace(
        'inputs = [{ source = "split", grouping = "fields", fields = ["word"] }]', 'inputs = [{ source = "count" }]')
    p = tmp_path / "wc.toml"
    p.write_text(text)
    with pytest.raises(TopologyError, match=rf"^{re.escape(str(p))}: bolt 'count' gets no input from any spout: "
                                            r"its only inputs are \['count'\]"):
        load_topology(p)


# --- empty field names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("build, pattern", [
    (lambda b: b.set_bolt("count", bolt(("word", ""))).shuffle_grouping("split"),
     r"bolt 'count': fields: field names must be non-empty strings, got \['word', ''\]"),
    (lambda b: b.set_bolt("count", ShellBolt(["python", "b.py"], streams={"side": [""]})).shuffle_grouping("split"),
     r"bolt 'count': stream 'side': fields: field names must be non-empty"),
    (lambda b: b.set_bolt("count", bolt()).fields_grouping("split", ["word", ""]),
     r"bolt 'count': input from 'split': fields: field names must be non-empty"),
])
def test_empty_field_names_are_refused(build, pattern):
    b = basic_builder()
    build(b)
    with pytest.raises(TopologyError, match=pattern):
        b.create_topology()


def test_empty_output_key_field_is_refused():
    from multilang.shellbolt import OutputSpec

    with pytest.raises(TopologyError, match=r"output: key: field names must be non-empty"):
        basic_builder().create_topology(output=OutputSpec("split", None, [""]))


def test_toml_empty_field_name_names_file_and_component(tmp_path):
    text = WORDCOUNT.read_text().replace('fields = ["word", "count"]', 'fields = ["word", ""]')
    p = tmp_path / "wc.toml"
    p.write_text(text)
    with pytest.raises(TopologyError, match=rf"^{re.escape(str(p))}: bolt 'count': fields: field names must be "
                                            r"non-empty strings"):
        load_topology(p)


def test_spout_with_inputs():
    b = basic_builder()
    b.set_spout("other", spout()).shuffle_grouping("sentences")
    with pytest.raises(TopologyError, match=r"spout 'other': spouts take no inputs"):
        b.create_topology()


def test_bolt_without_inputs():
    b = basic_builder()
    b.set_bolt("lonely", bolt())
    with pytest.raises(TopologyError, match=r"bolt 'lonely': has no inputs"):
        b.create_topology()


@pytest.mark.parametrize("cmd", ["python bolt.py", [], ["python", 3], ("python", "bolt.py"), None])
def test_command_not_a_list_of_strings(cmd):
    b = TopologyBuilder()
    b.set_spout("sentences", spout())
    b.set_bolt("split", ShellBolt(cmd, fields=["word"])).shuffle_grouping("sentences")
    with pytest.raises(TopologyError, match=r"bolt 'split': command must be a non-empty list of strings"):
        b.create_topology()


def test_unknown_grouping():
    b = basic_builder()
    b.set_bolt("count", bolt()).grouping("split", "partial_key")
    with pytest.raises(TopologyError) as ei:
        b.create_topology()
    msg = str(ei.value)
    assert "unknown grouping 'partial_key'" in msg and "'count'" in msg and "shuffle" in msg


def test_no_components_and_no_spout():
    with pytest.raises(TopologyError, match="no components"):
        TopologyBuilder().create_topology()
    b = TopologyBuilder()
    b.set_bolt("a", bolt()).shuffle_grouping("b")
    b.set_bolt("b", bolt()).shuffle_grouping("a")
    with pytest.raises(TopologyError, match="no spout"):
        b.create_topology()


@pytest.mark.parametrize("name", ["", "__acker", "__system"])
def test_reserved_or_empty_component_ids(name):
    b = basic_builder()
    b.set_bolt(name, bolt()).shuffle_grouping("sentences")
    with pytest.raises(TopologyError, match="reserved|non-empty"):
        b.create_topology()


def test_duplicate_output_fields():
    b = TopologyBuilder()
    b.set_spout("s", spout(fields=("a", "a")))
    with pytest.raises(TopologyError, match=r"duplicate fields"):
        b.create_topology()


def test_python_components_in_the_wrong_role():
    b = TopologyBuilder()
    b.set_spout("s", PythonBolt(lambda v: [v], fields=["x"]))
    with pytest.raises(TopologyError, match="PythonBolt cannot be a spout"):
        b.create_topology()
    b = TopologyBuilder()
    b.set_spout("s", PythonSpout([["a"]], fields=["x"]))
    b.set_bolt("b", PythonSpout([["a"]], fields=["x"])).shuffle_grouping("s")
    with pytest.raises(TopologyError, match="PythonSpout cannot be a bolt"):
        b.create_topology()


def test_output_spec_validation():
    from multilang.shellbolt import OutputSpec

    with pytest.raises(TopologyError, match="output component 'nope'"):
        basic_builder().create_topology(output=OutputSpec(component="nope"))
    with pytest.raises(TopologyError, match="declares no stream 'x'"):
        basic_builder().create_topology(output=OutputSpec(component="split", stream="x"))
    with pytest.raises(TopologyError, match=r"output key \['count'\]"):
        basic_builder().create_topology(output=OutputSpec(component="split", key=["count"]))


# --- task ids -------------------------------------------------------------------------------------


def test_task_ids_storm_style_sorted_by_component_id_from_1():
    b = TopologyBuilder()
    b.set_spout("zeta", spout(), parallelism=2)
    b.set_bolt("alpha", bolt(), parallelism=3).shuffle_grouping("zeta")
    b.set_bolt("mid", bolt(), parallelism=1).shuffle_grouping("alpha")
    b.set_bolt("Beta", bolt(), parallelism=2).shuffle_grouping("zeta")  # "B" < "a" (code points)
    topo = b.create_topology()
    tasks = {name: c.tasks for name, c in topo.components.items()}
    assert tasks == {"Beta": [1, 2], "alpha": [3, 4, 5], "mid": [6], "zeta": [7, 8]}
    assert topo.task_to_component() == {1: "Beta", 2: "Beta", 3: "alpha", 4: "alpha", 5: "alpha",
                                        6: "mid", 7: "zeta", 8: "zeta"}


# --- context ----------------------------------------------------------------------------------------


def context_topology():
    b = TopologyBuilder()
    b.set_spout("sentences", ShellSpout(["python", "s.py"], fields=["sentence"], streams={"meta": ["k", "v"]}))
    b.set_bolt("split", bolt(), parallelism=2).shuffle_grouping("sentences")
    b.set_bolt("count", bolt(("word", "count")), parallelism=2).fields_grouping("split", ["word"])
    b.set_bolt("report", bolt(("line",))).global_grouping("count").all_grouping("sentences", stream="meta")
    b.set_bolt("audit", bolt(("x",))).direct_grouping("split").none_grouping("count") \
        .local_or_shuffle_grouping("sentences", stream="meta")
    return b.create_topology()


def test_context_has_exactly_the_eight_keys_with_storm_types():
    topo = context_topology()
    for name, comp in topo.components.items():
        for task in comp.tasks:
            ctx = topo.context_for(name, task).to_json()
            assert set(ctx) == CONTEXT_KEYS
            assert ctx["taskid"] == task and isinstance(ctx["taskid"], int)
            assert ctx["componentid"] == name
            t2c = ctx["task->component"]
            assert all(isinstance(k, str) for k in t2c)
            all_tasks = {t for c in topo.components.values() for t in c.tasks}
            assert {int(k) for k in t2c} == all_tasks, "covers every task of the topology"
            assert all(t2c[str(t)] == c.name for c in topo.components.values() for t in c.tasks)


def test_context_of_a_middle_bolt():
    topo = context_topology()
    # sorted: audit 1, count 2-3, report 4, sentences 5, split 6-7
    assert topo.components["split"].tasks == [6, 7]
    ctx = topo.context_for("split", 7).to_json()
    assert ctx["task->component"] == {"1": "audit", "2": "count", "3": "count", "4": "report",
                                      "5": "sentences", "6": "split", "7": "split"}
    assert ctx["taskid"] == 7
    assert ctx["streams"] == ["default"]
    assert ctx["stream->outputfields"] == {"default": ["word"]}
    assert ctx["stream->target->grouping"] == {
        "default": {
            "count": {"type": "FIELDS", "fields": ["word"]},
            "audit": {"type": "DIRECT"},
        }
    }
    assert ctx["source->stream->grouping"] == {"sentences": {"default": {"type": "SHUFFLE"}}}
    assert ctx["source->stream->fields"] == {"sentences": {"default": ["sentence"]}}


def test_context_global_grouping_is_fields_with_empty_list():
    topo = context_topology()
    ctx = topo.context_for("report", 4).to_json()
    assert ctx["source->stream->grouping"] == {
        "count": {"default": {"type": "FIELDS", "fields": []}},
        "sentences": {"meta": {"type": "ALL"}},
    }
    assert ctx["source->stream->fields"] == {
        "count": {"default": ["word", "count"]},
        "sentences": {"meta": ["k", "v"]},
    }
    count_ctx = topo.context_for("count", 2).to_json()
    assert count_ctx["stream->target->grouping"] == {
        "default": {"report": {"type": "FIELDS", "fields": []}, "audit": {"type": "NONE"}}
    }


def test_context_of_a_spout_with_two_streams():
    topo = context_topology()
    ctx = topo.context_for("sentences", 5).to_json()
    assert sorted(ctx["streams"]) == ["default", "meta"]
    assert ctx["stream->outputfields"] == {"default": ["sentence"], "meta": ["k", "v"]}
    assert ctx["stream->target->grouping"] == {
        "default": {"split": {"type": "SHUFFLE"}},
        "meta": {"report": {"type": "ALL"}, "audit": {"type": "LOCAL_OR_SHUFFLE"}},
    }
    assert ctx["source->stream->grouping"] == {}
    assert ctx["source->stream->fields"] == {}


def test_only_fields_groupings_carry_a_fields_key():
    topo = context_topology()
    for name, comp in topo.components.items():
        ctx = topo.context_for(name, comp.tasks[0]).to_json()
        groupings = [g for s in ctx["stream->target->grouping"].values() for g in s.values()]
        groupings += [g for s in ctx["source->stream->grouping"].values() for g in s.values()]
        for g in groupings:
            if g["type"] == "FIELDS":
                assert set(g) == {"type", "fields"}
            else:
                assert set(g) == {"type"}


def test_conf_for_merges_component_conf_over_topology_conf():
    b = TopologyBuilder()
    b.set_spout("s", spout())
    b.set_bolt("b", bolt(), conf={"topology.tick.tuple.freq.secs": 5}).shuffle_grouping("s") \
        .add_configuration("x.y", 1)
    topo = b.create_topology({"topology.tick.tuple.freq.secs": 1, "x.y": 0})
    assert topo.conf_for("b")["topology.tick.tuple.freq.secs"] == 5
    assert topo.conf_for("b")["x.y"] == 1
    assert topo.conf_for("s")["topology.tick.tuple.freq.secs"] == 1


# --- resolve_command ------------------------------------------------------------------------------------


def test_resolve_command_python_is_this_interpreter_and_env_is_added(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "s.py").touch()  # a script that is not there is a TopologyError (tested in test_validation)
    (tmp_path / "b.py").touch()
    b = TopologyBuilder()
    b.set_spout("s", ShellSpout(["python", "s.py"], fields=["x"], env={"MY_TEST_VAR": "1"}, cwd="sub"))
    b.set_bolt("b", ShellBolt(["python3", "b.py", "--flag"], fields=["x"])).shuffle_grouping("s")
    topo = b.create_topology(resource_dir=tmp_path)
    argv, cwd, env = topo.resolve_command(topo.components["s"])
    assert argv == [sys.executable, "s.py"]
    assert cwd == str(tmp_path / "sub")
    assert env["MY_TEST_VAR"] == "1"
    assert env["PATH"] == os.environ["PATH"], "extra env vars are added, the inherited env is kept"
    argv, cwd, _ = topo.resolve_command(topo.components["b"])
    assert argv == [sys.executable, "b.py", "--flag"] and cwd == str(tmp_path)


def test_resolve_command_missing_cwd_is_a_topology_error(tmp_path):
    """Not a crash loop of "No such file or directory" restarts."""
    b = TopologyBuilder()
    b.set_spout("s", ShellSpout(["python", "s.py"], fields=["x"]))
    b.set_bolt("b", ShellBolt(["python", "b.py"], fields=["x"], cwd="nonexistent_dir")).shuffle_grouping("s")
    topo = b.create_topology(resource_dir=tmp_path)
    with pytest.raises(TopologyError, match=r"bolt 'b': cwd 'nonexistent_dir' does not exist \(.*nonexistent_dir; "
                                            r"a cwd is relative to "):
        topo.resolve_command(topo.components["b"])
    (tmp_path / "nonexistent_dir").write_text("a file")
    with pytest.raises(TopologyError, match=r"bolt 'b': cwd 'nonexistent_dir' is not a directory"):
        topo.resolve_command(topo.components["b"])


def test_toml_missing_cwd_fails_before_any_process_starts(tmp_path):
    from multilang.shellbolt import Runtime

    p = tmp_path / "topo.toml"
    p.write_text(textwrap.dedent(GOOD).replace("[bolts.c]\n", '[bolts.c]\ncwd = "nonexistent_dir"\n')
                 .replace('"node"', '"python"'))
    for script in ("s.py", "b.py"):  # the other components' scripts are there
        (tmp_path / script).touch()
    topo = load_topology(p)
    with pytest.raises(TopologyError, match=rf"^{re.escape(str(p))}: bolt 'c': cwd 'nonexistent_dir' does not exist"):
        Runtime(topo)


def test_resolve_command_not_found(tmp_path):
    b = TopologyBuilder()
    b.set_spout("s", ShellSpout(["no-such-binary-xyz", "s.py"], fields=["x"]))
    topo = b.create_topology(resource_dir=tmp_path)
    with pytest.raises(TopologyError, match=r"spout 's': command 'no-such-binary-xyz' not found"):
        topo.resolve_command(topo.components["s"])


# --- TOML ------------------------------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "topo.toml"
    p.write_text(textwrap.dedent(text))
    return p


GOOD = """
    [topology]
    name = "t"
    [topology.conf]
    "topology.max.spout.pending" = 5

    [spouts.src]
    command = ["python", "s.py"]
    fields = ["line"]

    [bolts.b]
    command = ["python", "b.py"]
    fields = ["w"]
    parallelism = 3
    inputs = [{ source = "src" }]

    [bolts.c]
    command = ["node", "c.js"]
    fields = ["w", "n"]
    inputs = [{ source = "b", grouping = "fields", fields = ["w"] }]
    conf = { "topology.tick.tuple.freq.secs" = 2 }

    [output]
    component = "c"
    key = ["w"]
"""


def test_load_good_toml(tmp_path):
    topo = load_topology(write(tmp_path, GOOD), {"x.y": 3, "topology.max.spout.pending": 9})
    assert topo.name == "t"
    assert topo.resource_dir == tmp_path.resolve()
    assert topo.conf["topology.max.spout.pending"] == 9, "overrides win over the file"
    assert topo.conf["x.y"] == 3
    assert topo.components["b"].parallelism == 3
    assert topo.components["b"].inputs[0].grouping == "shuffle", "default grouping"
    assert topo.components["b"].inputs[0].stream == "default"
    assert topo.components["c"].conf == {"topology.tick.tuple.freq.secs": 2}
    assert {n: c.tasks for n, c in topo.components.items()} == {"b": [1, 2, 3], "c": [4], "src": [5]}
    assert topo.output.component == "c" and topo.output.key == ["w"]


def test_load_wordcount_example():
    topo = load_topology(WORDCOUNT)
    assert topo.name == "wordcount"
    assert topo.resource_dir == WORDCOUNT.parent.resolve()
    assert {n: c.tasks for n, c in topo.components.items()} == {"count": [1, 2], "sentences": [3], "split": [4, 5]}
    assert topo.components["split"].impl.command == ["ruby", "ruby/split_bolt.rb"]
    assert topo.conf_for("split")["multilang.hold.emits.until.ack"] is True
    assert topo.conf["topology.max.spout.pending"] == 200
    assert topo.output.key == ["word"]


def test_toml_name_defaults_to_file_stem(tmp_path):
    text = GOOD.replace('name = "t"', "")
    assert load_topology(write(tmp_path, text)).name == "topo"


@pytest.mark.parametrize(
    "mutate, pattern",
    [
        (lambda s: s.replace('source = "src"', 'source = "nope"'), r"bolt 'b': input from unknown component 'nope'"),
        (lambda s: s.replace('inputs = [{ source = "src" }]', 'inputs = [{ source = "src", stream = "x" }]'),
         r"subscribes to stream 'x' of 'src'"),
        (lambda s: s.replace('fields = ["w"] }', 'fields = ["q"] }'), r"fields grouping on \['q'\]"),
        (lambda s: s.replace("parallelism = 3", "parallelism = 0"), r"bolt 'b': parallelism must be a positive"),
        (lambda s: s.replace("parallelism = 3", 'parallelism = "3"'), r"bolt 'b': parallelism must be a positive"),
        (lambda s: s.replace('command = ["python", "b.py"]', 'command = "python b.py"'),
         r"bolt 'b': command must be a non-empty list"),
        (lambda s: s.replace('command = ["python", "b.py"]', "command = []"), r"bolt 'b': command must be"),
        (lambda s: s.replace('grouping = "fields"', 'grouping = "fieldz"'), r"unknown grouping 'fieldz'"),
        (lambda s: s.replace("parallelism = 3", "paralelism = 3"), r"bolt 'b': unknown key 'paralelism'; did you mean 'parallelism'\?"),
        (lambda s: s + '\n[extras]\nx = 1\n', r"unknown top-level table 'extras'; allowed"),
        (lambda s: s.replace('command = ["python", "b.py"]\n', ""), r"bolt 'b': needs a 'command'"),
        (lambda s: s.replace('fields = ["line"]', ""), r"spout 'src': declare its output"),
        (lambda s: s.replace('[spouts.src]\ncommand = ["python", "s.py"]\nfields = ["line"]',
                             '[spouts.src]\ncommand = ["python", "s.py"]\nfields = ["line"]\ninputs = [{ source = "b" }]'),
         r"spout 'src': spouts take no inputs"),
        (lambda s: s.replace('inputs = [{ source = "src" }]', "inputs = []"),
         r"""bolt 'b': has no inputs; add e.g. inputs = \[\{ source = "src", grouping = "shuffle" \}\]$"""),
        (lambda s: s.replace('inputs = [{ source = "src" }]', 'inputs = [{ grouping = "all" }]'),
         r"bolt 'b': input #1: needs a 'source'"),
        (lambda s: s.replace('component = "c"', 'component = "zz"'), r"output component 'zz'"),
        (lambda s: s.replace('key = ["w"]', 'key = ["nope"]'), r"output key \['nope'\]"),
        (lambda s: s.replace("[bolts.c]", "[bolts.c]\nbogus = 1"), r"bolt 'c': unknown key 'bogus'; allowed"),
        (lambda s: s + '\n[spouts.b]\ncommand = ["x"]\nfields = ["y"]\n',
         r"topo\.toml: component 'b' is defined twice: as a spout \(\[spouts\.b\]\) and as a bolt \(\[bolts\.b\]\)"),
        (lambda s: s.replace('[topology]', '[topology\n'), r"not valid TOML"),
    ],
    ids=[
        "unknown-source", "undeclared-stream", "fields-missing-field", "parallelism-0", "parallelism-string",
        "command-string", "command-empty", "unknown-grouping", "unknown-component-key", "unknown-table",
        "no-command", "no-fields", "spout-with-inputs", "bolt-without-inputs", "input-without-source",
        "unknown-output-component", "bad-output-key", "unknown-key-2", "duplicate-component", "bad-toml",
    ],
)
def test_toml_errors_name_the_problem(tmp_path, mutate, pattern):
    text = mutate(textwrap.dedent(GOOD))
    p = tmp_path / "topo.toml"
    p.write_text(text)
    with pytest.raises(TopologyError, match=pattern):
        load_topology(p)


def test_toml_missing_file(tmp_path):
    with pytest.raises(TopologyError, match=r"not found"):
        load_topology(tmp_path / "absent.toml")


def test_a_cycle_is_found_and_named_in_wiring_order():
    b = TopologyBuilder()
    b.set_spout("s", PythonSpout([["a"]], fields=["x"]))
    b.set_bolt("a", ShellBolt(["cat"], fields=["x"])).shuffle_grouping("s").shuffle_grouping("c")
    b.set_bolt("b", ShellBolt(["cat"], fields=["x"])).shuffle_grouping("a")
    b.set_bolt("c", ShellBolt(["cat"], fields=["x"])).shuffle_grouping("b")
    b.set_bolt("d", ShellBolt(["cat"], fields=["x"])).shuffle_grouping("c")
    assert b.create_topology().cycle() == ["a", "b", "c", "a"]
    acyclic = TopologyBuilder()
    acyclic.set_spout("s", PythonSpout([["a"]], fields=["x"]))
    acyclic.set_bolt("a", ShellBolt(["cat"], fields=["x"])).shuffle_grouping("s")
    acyclic.set_bolt("b", ShellBolt(["cat"], fields=["x"])).shuffle_grouping("a").shuffle_grouping("s")
    assert acyclic.create_topology().cycle() is None


@pytest.mark.parametrize("loader", ["toml", "flux"])
def test_components_get_the_topology_name_in_their_conf(loader, tmp_path):
    # spec §2.2: Storm's submitter puts topology.name in every component's conf.
    if loader == "toml":
        topo = load_topology(WORDCOUNT)
    else:
        from multilang.shellbolt._model.flux import load_flux

        f = tmp_path / "t.yaml"
        f.write_text(textwrap.dedent("""\
            name: "flux-name"
            spouts:
              - id: "s"
                className: "org.apache.storm.flux.wrappers.spouts.FluxShellSpout"
                constructorArgs: [["python", "spout.py"], ["x"]]
            bolts:
              - id: "b"
                className: "org.apache.storm.flux.wrappers.bolts.FluxShellBolt"
                constructorArgs: [["python", "bolt.py"], ["x"]]
            streams:
              - from: "s"
                to: "b"
                grouping: {type: SHUFFLE}
            """))
        topo = load_flux(str(f))
    name = "wordcount" if loader == "toml" else "flux-name"
    assert all(topo.conf_for(c)["topology.name"] == name for c in topo.components)
