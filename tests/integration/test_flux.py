"""Storm Flux YAML topologies: ``multilang run file.yaml`` and ``load_flux``, with real processes.

The files under examples/flux/ are of the kind Storm's flux-examples use for
multilang (FluxShellSpout/FluxShellBolt next to LogInfoBolt, TestWordSpout
and TestWordCounter), pointing at our Python, Ruby and Node components.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import trio

from multilang.errors import TopologyError
from multilang.shellbolt import Runtime
from multilang.shellbolt._model.flux import OUTPUT_TAP, TEST_WORDS, load_flux, parse_properties, substitute

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FLUX = EXAMPLES / "flux"
COMPONENTS = Path(__file__).resolve().parent / "components"

_SCRIPT = Path(sys.executable).parent / "multilang"
ML = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-c", "from multilang._cli.entry import main; main()"]


def multilang(*args: str, timeout: float = 60, env: dict | None = None):
    return subprocess.run(ML + list(args), cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def _words():
    spec = importlib.util.spec_from_file_location("_split_bolt_example_flux", EXAMPLES / "python" / "split_bolt.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.words


def expected_counts(text: str) -> dict[str, int]:
    words = _words()
    lines = [ln.strip(" \t\n\r\f\v") for ln in text.split("\n")]
    return dict(Counter(w for ln in lines if ln for w in words(ln)))


def json_lines(text: str) -> list:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


_LOGGED = re.compile(r"org\.apache\.storm\.flux\.wrappers\.bolts\.LogInfoBolt: (\S+): (\[.*\])$")


def logged_tuples(stderr: str, component: str) -> list[list]:
    """The tuples LogInfoBolt ``component`` logged (one INFO line each)."""
    out = []
    for line in stderr.splitlines():
        m = _LOGGED.search(line)
        if m and m.group(1) == component:
            out.append(json.loads(m.group(2)))
    return out


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def run_topology(topology, **kw):
    out: list = []
    result = trio.run(lambda: Runtime(topology, on_output=out.append).run(until_done=True, **kw))
    return result, out


# --- multilang run on the example files ------------------------------------------------------------


def test_wordcount_yaml_gives_exact_counts():
    """Python spout -> Ruby split (2) -> Node count (2) -> LogInfoBolt, as Storm's multilang.yaml."""
    p = multilang("run", "examples/flux/wordcount.yaml", "--no-progress")
    assert p.returncode == 0, p.stderr[-3000:]
    records = json_lines(p.stdout)
    assert all(set(r) == {"word", "count"} for r in records)
    got = {r["word"]: r["count"] for r in records}
    assert len(got) == len(records), "one line per word: the final counts"
    assert got == expected_counts((EXAMPLES / "data" / "alice.txt").read_text(encoding="utf-8"))
    assert "log: emitted 0" in p.stderr, "LogInfoBolt got the counts and emitted nothing"


@pytest.mark.parametrize("workers", [1, 2])
def test_storm_multilang_yaml_logs_the_counts_through_log_info_bolt(workers):
    """Storm's flux multilang.yaml shape: Node spout, Python split, TestWordCounter, LogInfoBolt;
    on 2 host workers too (the in-process built-ins go to the workers by pickle: no closures)."""
    p = multilang("run", "examples/flux/multilang.yaml", "--no-progress", "--log-level", "info",
                  "--workers", str(workers))
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout == "", "nothing subscribes-free but LogInfoBolt, which declares no output"
    logged = logged_tuples(p.stderr, "log")
    final: dict[str, int] = {}
    for word, count in logged:
        final[word] = max(count, final.get(word, 0))
    expected = expected_counts((EXAMPLES / "data" / "alice.txt").read_text(encoding="utf-8"))
    assert final == expected, "TestWordCounter's running counts end at the exact counts"
    assert len(logged) == sum(expected.values()), "LogInfoBolt logged every tuple once"


def test_test_word_spout_to_shell_bolt_to_log_info_bolt_for_a_duration():
    """TestWordSpout (2 tasks, 500 words each) -> Ruby count bolt -> LogInfoBolt, --duration 5
    (the 1,000 words take well under a second; the rest is room for a busy machine)."""
    p = multilang("run", "examples/flux/test_words_shell.yaml", "--duration", "5", "--no-progress",
                  "--log-level", "info", timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    logged = logged_tuples(p.stderr, "log")
    assert logged, p.stderr[-3000:]
    assert {w for w, _ in logged} <= set(TEST_WORDS)
    final: dict[str, int] = {}
    for word, count in logged:
        final[word] = max(count, final.get(word, 0))
    assert sum(final.values()) == 1000 == len(logged), "every word counted once (finite TestWordSpout)"
    lasted = re.search(r"\[summary\] (\d+\.\d)s", p.stderr)
    assert lasted and float(lasted[1]) >= 5.0, "the run lasted the --duration"


def test_seeded_test_word_spout_tasks_draw_the_same_words_on_any_number_of_workers():
    """Each TestWordSpout task draws from the seed and its index in the component, not from the
    order its process made the tasks: on 2 workers each process makes only its own."""
    finals = []
    for workers in (1, 2):
        p = multilang("run", "examples/flux/test_words_shell.yaml", "--no-progress", "--log-level", "info",
                      "-c", "multilang.testwordspout.seed=7", "--workers", str(workers))
        assert p.returncode == 0, p.stderr[-3000:]
        final: dict[str, int] = {}
        for word, count in logged_tuples(p.stderr, "log"):
            final[word] = max(count, final.get(word, 0))
        assert sum(final.values()) == 1000, final
        finals.append(final)
    assert finals[1] == finals[0]


def test_simple_wordcount_yaml_all_builtins():
    p = multilang("run", "examples/flux/simple_wordcount.yaml", "--no-progress")
    assert p.returncode == 0, p.stderr[-3000:]
    records = json_lines(p.stdout)
    assert {r["word"] for r in records} <= set(TEST_WORDS)
    assert sum(r["count"] for r in records) == 1000
    assert len(records) == len({r["word"] for r in records})


def test_java_only_class_is_a_clear_error(tmp_path):
    path = write(tmp_path / "kafka.yaml", """
        name: "kafka"
        spouts:
          - id: "kafka-spout"
            className: "org.apache.storm.kafka.spout.KafkaSpout"
            constructorArgs:
              - "localhost:9092"
        bolts:
          - id: "log"
            className: "org.apache.storm.flux.wrappers.bolts.LogInfoBolt"
        streams:
          - from: "kafka-spout"
            to: "log"
            grouping: {type: SHUFFLE}
    """)
    p = multilang("run", str(path), "--no-progress", timeout=30)
    assert p.returncode == 2, p.stderr
    assert "org.apache.storm.kafka.spout.KafkaSpout" in p.stderr
    assert "'kafka-spout'" in p.stderr
    assert "FluxShellSpout" in p.stderr, "says what to use instead"
    assert "Traceback" not in p.stderr


# --- substitution ---------------------------------------------------------------------------------------


def test_env_and_properties_substitution_with_run(tmp_path):
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("The cat sat.\n\nOn the mat, the cat!\n")
    props = write(tmp_path / "dev.properties", """
        # Flux --filter file
        topology.name = filtered-wordcount
        split.parallelism: 2
        split.command ["ruby", "ruby/split_bolt.rb"]
    """)
    env = {**__import__("os").environ, "SENTENCES": str(sentences)}
    p = multilang("run", "examples/flux/filtered.yaml", "--filter", str(props), "-e", "--no-progress", env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    got = {r["word"]: r["count"] for r in json_lines(p.stdout)}
    assert got == {"the": 3, "cat": 2, "sat": 1, "on": 1, "mat": 1}
    assert "split: emitted 8, executed 2" in p.stderr

    # Without -e an ${ENV-...} placeholder is an error that says to pass -e.
    p = multilang("run", "examples/flux/filtered.yaml", "--filter", str(props), "--no-progress", env=env)
    assert p.returncode == 2 and "-e/--env-filter" in p.stderr and "filtered.yaml:" in p.stderr
    # Without --filter a property placeholder is an error that says to pass --filter.
    p = multilang("run", "examples/flux/filtered.yaml", "-e", "--no-progress", env=env)
    assert p.returncode == 2 and "${topology.name}" in p.stderr and "--filter" in p.stderr
    # --filter is for Flux files only.
    p = multilang("run", "examples/wordcount.toml", "--filter", str(props), "--no-progress")
    assert p.returncode == 2 and "Flux YAML" in p.stderr


def test_substitute_rules():
    props = {"a.list": '["x", "y z"]', "n": "3", "name": "t"}
    text = 'name: "${name}"\nn: ${n}\nl: ${a.list}\ni: "${a.list[1]}"\ne: "${ENV-HOME_X}"\n# ${unresolved} in a comment\n'
    out = substitute(text, props, {"HOME_X": "/h"})
    assert out.splitlines()[:5] == ['name: "t"', "n: 3", 'l: ["x", "y z"]', 'i: "y z"', 'e: "/h"']
    assert "${unresolved}" in out
    with pytest.raises(TopologyError, match=r"<yaml>:2: .*\$\{n\}"):
        substitute("a: 1\nb: ${n}\n")
    with pytest.raises(TopologyError, match="environment variable 'NOPE' is not set"):
        substitute("a: ${ENV-NOPE}", {}, {})
    with pytest.raises(TopologyError, match="env-filter"):
        substitute("a: ${ENV-HOME}", {}, None)
    with pytest.raises(TopologyError, match="only 2 items"):
        substitute("a: ${a.list[5]}", props, None)


def test_parse_properties_java_format(tmp_path):
    path = write(tmp_path / "p.properties", """
        # comment
        ! also a comment
        a=1
        b : two words
        c three
        d = multi \\
            line
        e\\:key = v\\tw
        f=\\u0041
        empty=
    """)
    assert parse_properties(path) == {"a": "1", "b": "two words", "c": "three", "d": "multi line",
                                      "e:key": "v\tw", "f": "A", "empty": ""}


# --- load_flux ------------------------------------------------------------------------------------------


def _shell_file(tmp_path: Path, body: str) -> Path:
    return write(tmp_path / "t.yaml", body)


def test_groupings_streams_parallelism_and_config(tmp_path):
    path = _shell_file(tmp_path, """
        name: "groupings"
        config:
          topology.max.spout.pending: 7
          topology.workers: 3
        spouts:
          - id: "s"
            className: "org.apache.storm.flux.wrappers.spouts.FluxShellSpout"
            constructorArgs: [["python3", "s.py"], ["a", "b"]]
            configMethods:
              - name: "setNamedStream"
                args: ["side", ["x"]]
        bolts:
          - id: "b"
            className: "org.apache.storm.flux.wrappers.bolts.FluxShellBolt"
            constructorArgs: [["python3", "b.py"]]
            configMethods:
              - name: "setDefaultStream"
                args: [["out"]]
              - name: "addComponentConfig"
                args: ["publisher.data_paths", ["actions"]]
            config: {my.key: 1}
            parallelism: 2
            numTasks: 3
    """ + "".join(f"""
          - id: "{t.lower()}"
            className: "org.apache.storm.flux.wrappers.bolts.LogInfoBolt"
    """ for t in ["SHUFFLE", "FIELDS", "ALL", "GLOBAL", "NONE", "LOCAL_OR_SHUFFLE", "DIRECT", "SIDE"]) + """
        streams:
          - {from: s, to: b, grouping: {type: SHUFFLE}}
          - {from: s, to: shuffle, grouping: {type: SHUFFLE}}
          - {from: s, to: fields, grouping: {type: FIELDS, args: [b]}}
          - {from: s, to: all, grouping: {type: ALL}}
          - {from: s, to: global, grouping: {type: GLOBAL}}
          - {from: s, to: none, grouping: {type: NONE}}
          - {from: s, to: local_or_shuffle, grouping: {type: LOCAL_OR_SHUFFLE}}
          - {from: b, to: direct, grouping: {type: DIRECT}}
          - {from: s, to: side, grouping: {type: SHUFFLE, streamId: side}}
    """)
    topo = load_flux(path)
    assert topo.name == "groupings"
    assert topo.conf["topology.max.spout.pending"] == 7
    assert topo.resource_dir == tmp_path.resolve()
    s, b = topo.components["s"], topo.components["b"]
    assert s.kind == "spout" and s.impl.command == ["python3", "s.py"]
    assert s.outputs == {"default": ["a", "b"], "side": ["x"]}
    assert b.outputs == {"default": ["out"]}
    assert b.parallelism == 3, "numTasks: one process per task, as Storm's ShellBolt"
    assert b.conf == {"my.key": 1, "publisher.data_paths": ["actions"]}
    kinds = {c: (i.grouping, i.stream, i.fields) for c, comp in topo.components.items() for i in comp.inputs}
    assert kinds["fields"] == ("fields", "default", ["b"])
    assert kinds["side"] == ("shuffle", "side", [])
    assert {c: g for c, (g, _, _) in kinds.items()} == {
        "b": "shuffle", "shuffle": "shuffle", "fields": "fields", "all": "all", "global": "global",
        "none": "none", "local_or_shuffle": "local_or_shuffle", "direct": "direct", "side": "shuffle"}


def test_shell_subclass_with_command_and_fields_is_a_shell_component(tmp_path):
    path = _shell_file(tmp_path, """
        spouts:
          - id: "words"
            className: "org.apache.storm.testing.TestWordSpout"
        bolts:
          - id: "split"
            className: "com.example.storm.SplitSentenceBolt"
            constructorArgs:
              - ["python3", "splitsentence.py"]
              - ["word"]
        streams:
          - {from: words, to: split, grouping: {type: SHUFFLE}}
    """)
    comp = load_flux(path).components["split"]
    assert comp.is_shell and comp.impl.command == ["python3", "splitsentence.py"] and comp.outputs == {
        "default": ["word"]}


@pytest.mark.parametrize("cls, meant", [
    ("org.apache.storm.flux.wrappers.bolts.FluxShelBolt", "org.apache.storm.flux.wrappers.bolts.FluxShellBolt"),
    ("org.apache.storm.flux.wrappers.bolt.FluxShellBolt", "org.apache.storm.flux.wrappers.bolts.FluxShellBolt"),
    ("org.apache.storm.flux.wrappers.bolts.fluxShellBolt", "org.apache.storm.flux.wrappers.bolts.FluxShellBolt"),
    ("org.apache.storm.task.ShelBolt", "org.apache.storm.task.ShellBolt"),
    ("FluxShellBolt", "org.apache.storm.flux.wrappers.bolts.FluxShellBolt"),
    ("org.apache.storm.testing.TestWordCountr", "org.apache.storm.testing.TestWordCounter"),
])
def test_class_name_typo_is_an_error_with_did_you_mean(tmp_path, cls, meant):
    """With [[command], [fields]] any class runs as a ShellBolt subclass, so a
    typo in a known class would otherwise run silently (Storm's Flux fails
    with ClassNotFoundException)."""
    path = _shell_file(tmp_path, f"""
        spouts:
          - {{id: words, className: org.apache.storm.testing.TestWordSpout}}
        bolts:
          - id: split
            className: "{cls}"
            constructorArgs: [["python3", "splitsentence.py"], ["word"]]
        streams:
          - {{from: words, to: split, grouping: {{type: SHUFFLE}}}}
    """)
    with pytest.raises(TopologyError) as info:
        load_flux(path)
    assert str(info.value).startswith(f"{path}: bolt 'split': unknown className {cls!r}; did you mean {meant!r}?")


def test_class_name_of_own_shell_subclass_still_runs_as_a_shell_component(tmp_path):
    """Arbitrary names are kept for user subclasses: only near misses of known classes are refused."""
    for cls in ("com.example.ShellBolt", "com.example.storm.FluxShellBoltWithRetry", "SplitBolt"):
        path = _shell_file(tmp_path, f"""
            spouts: [{{id: words, className: org.apache.storm.testing.TestWordSpout}}]
            bolts: [{{id: split, className: "{cls}", constructorArgs: [["python3", "split.py"], ["word"]]}}]
            streams: [{{from: words, to: split, grouping: {{type: SHUFFLE}}}}]
        """)
        assert load_flux(path).components["split"].is_shell, cls


def test_duplicate_id_names_both_kinds(tmp_path):
    path = _shell_file(tmp_path, """
        spouts: [{id: x, className: org.apache.storm.testing.TestWordSpout}]
        bolts: [{id: x, className: org.apache.storm.flux.wrappers.bolts.LogInfoBolt}]
        streams: [{from: x, to: x, grouping: {type: SHUFFLE}}]
    """)
    with pytest.raises(TopologyError, match=rf"^{re.escape(str(path))}: id 'x' is defined twice: as a spout and as a "
                                            r"bolt; ids must be unique"):
        load_flux(path)
    path = _shell_file(tmp_path, """
        spouts: [{id: s, className: org.apache.storm.testing.TestWordSpout}]
        bolts:
          - {id: x, className: org.apache.storm.flux.wrappers.bolts.LogInfoBolt}
          - {id: x, className: org.apache.storm.flux.wrappers.bolts.LogInfoBolt}
        streams: [{from: s, to: x, grouping: {type: SHUFFLE}}]
    """)
    with pytest.raises(TopologyError, match=r": id 'x' is defined twice: as two bolts; ids must be unique"):
        load_flux(path)


def test_bolt_fed_only_by_itself_is_an_error(tmp_path):
    path = _shell_file(tmp_path, """
        spouts: [{id: words, className: org.apache.storm.testing.TestWordSpout}]
        bolts:
          - {id: count, className: org.apache.storm.testing.TestWordCounter}
          - {id: log, className: org.apache.storm.flux.wrappers.bolts.LogInfoBolt}
        streams:
          - {from: count, to: count, grouping: {type: FIELDS, args: [word]}}
          - {from: words, to: log, grouping: {type: SHUFFLE}}
    """)
    with pytest.raises(TopologyError, match=rf"^{re.escape(str(path))}: bolt 'count' gets no input from any spout: "
                                            r"its only inputs are \['count'\]"):
        load_flux(path)


@pytest.mark.parametrize("body, needles", [
    ("""
        spouts: [{id: s, className: org.apache.storm.testing.TestWordSpout}]
        bolts: [{id: b, className: org.apache.storm.flux.wrappers.bolts.LogInfoBolt}]
        streams: [{from: s, to: b, grouping: {type: CUSTOM, customClass: {className: org.apache.storm.testing.NGrouping}}}]
     """, ["org.apache.storm.testing.NGrouping", "CUSTOM"]),
    ("""
        name: x
        topologySource: {className: org.apache.storm.flux.test.SimpleTopology}
     """, ["org.apache.storm.flux.test.SimpleTopology", "spouts, bolts and streams"]),
    ("""
        components: [{id: tr, className: org.apache.storm.flux.examples.OnlyValueRecordTranslator}]
        spouts: [{id: s, className: org.apache.storm.testing.TestWordSpout}]
     """, ["OnlyValueRecordTranslator", "no JVM"]),
    ("""
        spouts: [{id: s, className: org.apache.storm.flux.wrappers.bolts.FluxShellBolt, constructorArgs: [[a], [b]]}]
     """, ["is a bolt, not a spout"]),
    ("""
        spouts: [{id: s, className: org.apache.storm.testing.TestWordSpout}]
        bolts: [{id: b, className: org.apache.storm.flux.wrappers.bolts.LogInfoBolt}]
        streams: [{from: s, to: nope, grouping: {type: SHUFFLE}}]
     """, ["'to: nope'", "ids: ['b', 's']"]),
    ("""
        spouts: [{id: s, className: org.apache.storm.testing.TestWordSpout}]
        bolts: [{id: b, className: org.apache.storm.flux.wrappers.bolts.LogInfoBolt}]
        streams: [{from: s, to: b, grouping: {type: FIELDS, args: [nope]}}]
     """, ["fields grouping on ['nope']", "['word']"]),
    ("""
        spouts: [{id: s, className: org.apache.storm.flux.wrappers.spouts.FluxShellSpout,
                  constructorArgs: [[a], [b]], configMethods: [{name: withFoo, args: [1]}]}]
     """, ["withFoo", "addComponentConfig"]),
])


def test_unsupported_things_are_topology_errors(tmp_path, body, needles):
    path = _shell_file(tmp_path, body)
    with pytest.raises(TopologyError) as info:
        load_flux(path)
    for needle in needles:
        assert needle in str(info.value), str(info.value)


@pytest.mark.parametrize("body, needle", [
    ("""
        spouts: [{id: s, className: org.apache.storm.testing.TestWordSpout}]
        bolts: [{id: b, className: org.apache.storm.flux.wrappers.bolts.LogInfoBolt}]
        streams: [{from: s, to: b, grouping: {type: SHUFFLE, args: [word]}}]
     """, "args ['word'] apply to the FIELDS grouping only, not SHUFFLE"),
    # YAML keeps the last of a key given twice: one setting would vanish without a word
    ("""
        config:
          multilang.output.component: count
          multilang.output.component: split
        spouts: [{id: s, className: org.apache.storm.testing.TestWordSpout}]
     """, "line 4: key 'multilang.output.component' is given twice (first on line 3)"),
    ("""
        spouts: [{id: s, className: org.apache.storm.testing.TestWordSpout, parallelism: 2, parallelism: 1}]
     """, "line 2: key 'parallelism' is given twice (first on line 2)"),
])
def test_mistakes_that_flux_would_pass_over_are_topology_errors(tmp_path, body, needle):
    path = _shell_file(tmp_path, body)
    with pytest.raises(TopologyError) as info:
        load_flux(path)
    assert str(info.value).startswith(f"{path}: ") and needle in str(info.value), str(info.value)


@pytest.mark.parametrize("value, needle", [
    ("!!int two", "line 2, column 82: !!int 'two' is not a valid int (invalid literal"),
    ('!!int ""', "!!int '' is not a valid int"),
    ("!!float abc", "!!float 'abc' is not a valid float"),
    ("!!bool maybe", "!!bool 'maybe' is not a valid bool"),
    ("!!timestamp 2020-13-45", "!!timestamp '2020-13-45' is not a valid timestamp (month must be in 1..12)"),
    ("!!timestamp 2020-02-30", "is not a valid timestamp (day is out of range for month)"),
    ("!!map x", "expected a mapping node, but found scalar"),
])
def test_a_tagged_value_its_tag_cannot_take_is_a_yaml_error_at_its_line(tmp_path, value, needle):
    # (a trial: PyYAML's ValueError, KeyError or IndexError, with a traceback and exit 1)
    path = _shell_file(tmp_path, f"""
        spouts: [{{id: s, className: org.apache.storm.testing.TestWordSpout, parallelism: {value}}}]
    """)
    with pytest.raises(TopologyError) as info:
        load_flux(path)
    assert str(info.value).startswith(f"{path}: not valid YAML: ") and needle in str(info.value), str(info.value)


def test_a_yaml_file_that_is_not_utf8_is_a_topology_error_naming_it(tmp_path):
    # (a trial: UnicodeDecodeError with a traceback, for the file and for a file it includes)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: x\n# caf\xe9\nspouts: [{id: s, className: org.apache.storm.testing.TestWordSpout}]\n")
    with pytest.raises(TopologyError, match=r"latin\.yaml: not valid YAML: line 2: byte 0xe9 is not UTF-8"):
        load_flux(latin)
    main = write(tmp_path / "main.yaml", """
        includes: [{resource: false, file: latin.yaml}]
    """)
    with pytest.raises(TopologyError, match=r"latin\.yaml: not valid YAML: line 2: byte 0xe9"):
        load_flux(main)


def test_a_properties_file_in_latin1_reads_as_java_reads_it(tmp_path):
    # Java's Properties.load, which Flux's --filter uses, reads ISO-8859-1: a Storm user's file with "caf\xe9"
    # in it failed here with a traceback. UTF-8 is read as UTF-8.
    (tmp_path / "latin.properties").write_bytes(b"name = caf\xe9\n")
    (tmp_path / "utf8.properties").write_bytes("name = caf\u00e9 \u2713\n".encode())
    assert parse_properties(tmp_path / "latin.properties") == {"name": "caf\u00e9"}
    assert parse_properties(tmp_path / "utf8.properties") == {"name": "caf\u00e9 \u2713"}


def test_keys_a_yaml_merge_brings_in_may_be_overridden(tmp_path):
    path = _shell_file(tmp_path, """
        spouts:
          - &word {id: s, className: org.apache.storm.testing.TestWordSpout, parallelism: 2}
          - <<: *word
            id: t
        bolts: [{id: b, className: org.apache.storm.flux.wrappers.bolts.LogInfoBolt}]
        streams: [{from: s, to: b, grouping: {type: SHUFFLE}}, {from: t, to: b, grouping: {type: SHUFFLE}}]
    """)
    topo = load_flux(path)
    assert {n: topo.components[n].parallelism for n in ("s", "t")} == {"s": 2, "t": 2}


def test_includes_and_override(tmp_path):
    write(tmp_path / "base.yaml", """
        name: "base"
        config: {a: base, b: base}
        spouts: [{id: s, className: org.apache.storm.testing.TestWordSpout}]
        bolts:
          - {id: count, className: org.apache.storm.testing.TestWordCounter}
        streams: [{from: s, to: count, grouping: {type: FIELDS, args: [word]}}]
    """)
    write(tmp_path / "over.yaml", """
        config: {b: over}
        bolts:
          - {id: count, className: org.apache.storm.testing.TestWordCounter, parallelism: 3}
    """)
    main = write(tmp_path / "main.yaml", """
        name: "main"
        includes:
          - {file: "base.yaml", override: false}
          - {file: "over.yaml", override: true}
        config: {a: main}
    """)
    topo = load_flux(main)
    assert topo.name == "main"
    assert topo.conf["a"] == "main" and topo.conf["b"] == "over"
    assert topo.components["count"].parallelism == 3
    assert topo.components["count"].inputs[0].fields == ["word"]


def test_resources_dir_is_where_commands_run(tmp_path):
    (tmp_path / "resources").mkdir()
    (tmp_path / "resources" / "upper.py").write_text(textwrap.dedent("""
        from multilang import BasicBolt
        class Upper(BasicBolt):
            def process(self, tup):
                self.emit([tup.values[0].upper()])
        Upper().run()
    """))
    path = _shell_file(tmp_path, """
        config: {multilang.testwordspout.count: 20, multilang.testwordspout.seed: 1}
        spouts: [{id: s, className: org.apache.storm.testing.TestWordSpout}]
        bolts:
          - id: up
            className: org.apache.storm.flux.wrappers.bolts.FluxShellBolt
            constructorArgs: [["python3", "upper.py"], ["word"]]
            parallelism: 2
        streams: [{from: s, to: up, grouping: {type: ALL}}]
    """)
    topo = load_flux(path)
    assert topo.resource_dir == (tmp_path / "resources").resolve()
    result, out = run_topology(topo)
    assert result.ok
    words = Counter(r["word"] for r in out)
    assert sum(words.values()) == 40, "ALL: each of the 2 tasks got all 20 words"
    assert set(words) <= {w.upper() for w in TEST_WORDS}


def test_output_of_a_subscribed_stream_goes_through_a_tap(tmp_path):
    path = _shell_file(tmp_path, f"""
        config:
          multilang.testwordspout.count: 50
          multilang.output.component: count
          multilang.output.key: [word]
        spouts: [{{id: s, className: org.apache.storm.testing.TestWordSpout, parallelism: 2}}]
        bolts:
          - id: count
            className: org.apache.storm.flux.wrappers.bolts.FluxShellBolt
            constructorArgs: [["python3", "{EXAMPLES / 'python' / 'count_bolt.py'}"], ["word", "count"]]
            parallelism: 2
          - {{id: log, className: org.apache.storm.flux.wrappers.bolts.LogInfoBolt}}
        streams:
          - {{from: s, to: count, grouping: {{type: FIELDS, args: [word]}}}}
          - {{from: count, to: log, grouping: {{type: GLOBAL}}}}
    """)
    topo = load_flux(path)
    assert OUTPUT_TAP in topo.components
    result, _ = run_topology(topo)
    assert result.ok
    assert sum(r["count"] for r in result.outputs) == 100
    assert all(set(r) == {"word", "count"} for r in result.outputs)


def test_add_component_config_reaches_the_component(tmp_path):
    path = _shell_file(tmp_path, f"""
        config: {{multilang.testwordspout.count: 3, topo.key: topo}}
        spouts: [{{id: s, className: org.apache.storm.testing.TestWordSpout}}]
        bolts:
          - id: conf
            className: org.apache.storm.flux.wrappers.bolts.FluxShellBolt
            constructorArgs: [["python3", "{COMPONENTS / 'conf_bolt.py'}"], ["key", "value"]]
            configMethods:
              - {{name: addComponentConfig, args: [nathan, from-method]}}
              - {{name: addComponentConfig, args: [mike, from-method]}}
              - {{name: addComponentConfig, args: [jackson, from-method]}}
              - {{name: addComponentConfig, args: [golda, from-method]}}
              - {{name: addComponentConfig, args: [bertels, from-method]}}
        streams: [{{from: s, to: conf, grouping: {{type: SHUFFLE}}}}]
    """)
    result, out = run_topology(load_flux(path))
    assert result.ok and len(out) == 3
    assert all(r["value"] == "from-method" for r in out)
