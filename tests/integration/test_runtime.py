"""The host runtime end to end: real Python, Ruby and Node component processes
under ``multilang.shellbolt.Runtime`` (and in-process components under a
MockClock where virtual time is the point).

Components used here: examples/ (the word count, the conformance components)
and tests/integration/components/ (a scripted spout that reports every ack
and fail it gets on an "events" stream, a bolt that tags its outputs with its
task id). Every run checks afterwards that no component process is left
behind: every pid seen during the run is gone (reaped, not a zombie) and this
process has no children left.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import signal
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest
import trio
import trio.testing

from multilang import TopologyError
from multilang import testing
from multilang.shellbolt import (
    Grouping,
    OutputSpec,
    PythonBolt,
    PythonSpout,
    Runtime,
    ShellBolt,
    ShellSpout,
    TopologyBuilder,
    fields_task_index,
    load_topology,
    register_grouping,
)
from multilang.shellbolt._model.grouping import GROUPINGS
from multilang.testing import TopologyRun
from multilang.testing import assert_no_orphans, child_pids, gone, wait_until

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
COMPONENTS = Path(__file__).resolve().parent / "components"
SCRIPTED_SPOUT = COMPONENTS / "scripted_spout.py"
TAG_BOLT = COMPONENTS / "tag_bolt.py"
CONFORMANCE_PY = EXAMPLES / "python" / "conformance_component.py"
EVENT_FIELDS = ["event", "msg_id", "outstanding"]

needs_ruby_node = pytest.mark.skipif(
    shutil.which("ruby") is None or shutil.which("node") is None, reason="the word count needs ruby and node"
)


# --- helpers ---------------------------------------------------------------------------


def _load_words():
    spec = importlib.util.spec_from_file_location("_split_bolt_example", EXAMPLES / "python" / "split_bolt.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.words


def expected_wordcount(path: Path = EXAMPLES / "data" / "alice.txt", limit: int | None = None) -> dict[str, int]:
    """What the word count must print: examples/python/sentence_spout.py's
    lines (stripped, non-empty) split by examples/python/split_bolt.py's rule."""
    words = _load_words()
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    lines = [line for line in lines if line]
    if limit is not None:
        lines = lines[:limit]
    return dict(Counter(w for line in lines for w in words(line)))


def py(script: Path, *args: str) -> list[str]:
    return ["python", str(script), *args]


def scripted_spout(items: list[dict[str, Any]], fields: list[str], **opts: Any) -> ShellSpout:
    return ShellSpout(py(SCRIPTED_SPOUT, json.dumps({"items": items, **opts})), fields=fields,
                      streams={"events": EVENT_FIELDS})


def tag_bolt(*args: str) -> ShellBolt:
    return ShellBolt(py(TAG_BOLT, *args), fields=["task", "values"])


class Run(TopologyRun):
    def events(self, spout: str = "spout") -> list[tuple[str, Any]]:
        return [(r["event"], r["msg_id"]) for r in self.records(spout, "events")]

    def timed_events(self, spout: str = "spout") -> list[tuple[float, str, Any, int]]:
        return [(t, r["event"], r["msg_id"], r["outstanding"]) for t, r in self.outputs
                if r.get("component") == spout and r.get("stream") == "events"]


def run_topology(topology, *, during: Callable[[Runtime], Awaitable[None]] | None = None, limit: float = 20,
                 **run_kw: Any) -> Run:
    """multilang.testing.run_topology: a hard time limit, outputs with their
    trio time, and every component pid seen."""
    return testing.run_topology(topology, during=during, limit=limit, sample_every=0.005, run_type=Run, **run_kw)


def build(builder: TopologyBuilder, **conf: Any):
    conf = {"multilang.shutdown.grace.secs": 1, "multilang.kill.grace.secs": 1, **conf}
    return builder.create_topology(conf, resource_dir=ROOT)


def task_of(rt: Runtime, component: str, index: int = 0):
    return rt.tasks[rt.topology.components[component].tasks[index]]


# --- the word count (Python spout, Ruby split, Node count) ----------------------------------


@needs_ruby_node
def test_wordcount_exact_counts():
    topo = load_topology(EXAMPLES / "wordcount.toml")
    run = run_topology(topo, limit=120)
    res = run.result
    assert res.ok, res
    got = {r["word"]: r["count"] for r in res.outputs}
    assert got == expected_wordcount()
    assert res.failed == 0 and res.pending == 0 and not res.gave_up
    assert res.stats["sentences"].acked == res.completed
    assert all(s.restarts == 0 for s in res.stats.values())
    assert len(run.pids) == 5  # 1 spout + 2 split + 2 count
    assert_no_orphans(run)


@needs_ruby_node
@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
def test_component_processes_run_under_sched_batch_where_their_conf_says_so():
    """multilang.sched.batch (default false): a component's processes do not
    preempt the host that hands them tuples. The split bolt turns it on."""
    topo = load_topology(EXAMPLES / "wordcount.toml")
    topo.components["split"].conf["multilang.sched.batch"] = True
    policies: dict[str, set[int]] = defaultdict(set)

    async def during(rt: Runtime) -> None:
        pids = {}
        await wait_until(lambda: all(testing.current_pid(rt, t) for t in rt.tasks), timeout=30)
        for t, task in rt.tasks.items():
            pids[t] = (task.name, testing.current_pid(rt, t))
        for name, pid in pids.values():
            policies[name].add(os.sched_getscheduler(pid))

    run_topology(topo, during=during, limit=120)
    assert dict(policies) == {"sentences": {os.SCHED_OTHER}, "count": {os.SCHED_OTHER}, "split": {os.SCHED_BATCH}}


LANG = {
    "python": lambda name: ["python", f"python/{name}.py"],
    "ruby": lambda name: ["ruby", f"ruby/{name}.rb"],
    "node": lambda name: ["node", f"node/{name}.js"],
}


@needs_ruby_node
@pytest.mark.parametrize("spout_lang, split_lang, count_lang", [("ruby", "node", "python"),
                                                                 ("node", "python", "ruby")])
def test_wordcount_other_language_mixes_built_in_python(spout_lang, split_lang, count_lang):
    b = TopologyBuilder()
    b.set_spout("sentences", ShellSpout(LANG[spout_lang]("sentence_spout") + ["data/alice.txt"], fields=["sentence"]))
    b.set_bolt("split", ShellBolt(LANG[split_lang]("split_bolt"), fields=["word"]), parallelism=2) \
        .shuffle_grouping("sentences")
    b.set_bolt("count", ShellBolt(LANG[count_lang]("count_bolt"), fields=["word", "count"]), parallelism=2) \
        .fields_grouping("split", ["word"])
    topo = b.create_topology({"topology.max.spout.pending": 200}, resource_dir=EXAMPLES,
                             output=OutputSpec(component="count", key=["word"]))
    run = run_topology(topo, limit=120)
    assert run.result.ok, run.result
    assert {r["word"]: r["count"] for r in run.result.outputs} == expected_wordcount()
    assert_no_orphans(run)


@needs_ruby_node
def test_wordcount_survives_sigkill_of_a_ruby_split_bolt():
    topo = load_topology(EXAMPLES / "wordcount.toml")
    killed: list[int] = []
    stopped_empty = 0

    async def killer(rt: Runtime) -> None:
        nonlocal stopped_empty
        split = rt.topology.components["split"].tasks
        await wait_until(lambda: rt.stats["split"].emitted > 300)
        while True:
            for tid in split:
                task = rt.tasks[tid]
                proc = task.proc
                if proc is None or proc.proc is None or not task.in_flight:
                    continue
                pid = proc.proc.pid
                # Freeze it, let the host read what it already wrote, then
                # kill it only if tuples are really still in flight there.
                os.kill(pid, signal.SIGSTOP)
                await trio.sleep(0.05)
                if task.in_flight and task.proc is proc:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
                os.kill(pid, signal.SIGCONT)
                stopped_empty += 1
            await trio.sleep(0.002)

    run = run_topology(topo, during=killer, limit=120)
    res = run.result
    assert len(killed) == 1, f"could not catch a split bolt with tuples in flight ({stopped_empty} tries)"
    assert res.ok, res
    got = {r["word"]: r["count"] for r in res.outputs}
    assert got == expected_wordcount(), "counts are exact after the kill and the replay"
    assert res.stats["split"].restarts == 1
    assert res.stats["count"].restarts == 0 and res.stats["sentences"].restarts == 0
    assert res.stats["split"].failed > 0, "the dead process's in-flight tuples were failed"
    assert res.stats["sentences"].failed > 0 or res.failed > 0, "their trees failed (and were replayed)"
    assert res.stats["sentences"].acked == res.completed
    assert killed[0] in run.pids and gone(killed[0])
    assert_no_orphans(run)


# --- groupings end to end -------------------------------------------------------------------------


def _grouping_topology(kind: str, n_items: int, parallelism: int = 3, keys: list[str] | None = None):
    keys = keys or [f"k{i % 7}" for i in range(n_items)]
    items = [[keys[i % len(keys)], i] for i in range(n_items)]
    b = TopologyBuilder()
    b.set_spout("spout", PythonSpout(items, fields=["key", "seq"]))
    decl = b.set_bolt("tag", tag_bolt(), parallelism=parallelism)
    if kind == "fields":
        decl.fields_grouping("spout", ["key"])
    else:
        decl.grouping("spout", kind)
    return build(b), items


def _received(run: Run) -> dict[int, list[list[Any]]]:
    got: dict[int, list[list[Any]]] = defaultdict(list)
    for r in run.records("tag"):
        got[r["task"]].append(r["values"])
    return got


def test_fields_grouping_a_key_always_reaches_one_task():
    keys = [f"word{i}" for i in range(12)]
    topo, items = _grouping_topology("fields", 48, keys=keys)
    tasks = topo.components["tag"].tasks
    expected_task = {k: tasks[fields_task_index([k], len(tasks))] for k in keys}
    assert set(expected_task.values()) == set(tasks), "test keys must cover every task"
    run = run_topology(topo)
    assert run.result.ok
    got = _received(run)
    key_tasks: dict[str, set[int]] = defaultdict(set)
    for task, tuples in got.items():
        for key, _seq in tuples:
            key_tasks[key].add(task)
    assert {k: v for k, v in key_tasks.items()} == {k: {t} for k, t in expected_task.items()}
    assert sorted(seq for tuples in got.values() for _, seq in tuples) == list(range(48))
    assert_no_orphans(run)


class _ByLength(Grouping):
    """A grouping for this test only: a tuple goes to the task whose index
    is the length of its first field, modulo the number of tasks."""

    kind, storm_type = "test_by_length", "CUSTOM_OBJECT"
    takes_fields = keyed = True

    def choose(self, values: list[Any]) -> list[int]:
        return [self.tasks[len(values[self.field_index[0]]) % len(self.tasks)]]


def test_a_grouping_is_added_by_writing_one_class_and_registering_it(monkeypatch):
    monkeypatch.setitem(GROUPINGS, _ByLength.kind, _ByLength)  # register_grouping, undone after the test
    assert register_grouping(_ByLength) is _ByLength
    keys = ["a", "bb", "ccc", "dddd", "eeeee", "ffffff"]
    b = TopologyBuilder()
    b.set_spout("spout", PythonSpout([[keys[i % 6], i] for i in range(36)], fields=["key", "seq"]))
    b.set_bolt("tag", tag_bolt(), parallelism=3).grouping("spout", "test_by_length", fields=["key"])
    topo = build(b)
    tasks = topo.components["tag"].tasks
    context = topo.context_for("tag", tasks[0])
    assert context.source_to_stream_to_grouping == {"spout": {"default": {"type": "CUSTOM_OBJECT"}}}
    run = run_topology(topo)
    assert run.result.ok
    got = _received(run)
    assert {t: sorted({k for k, _ in v}) for t, v in got.items()} == {
        tasks[0]: ["ccc", "ffffff"], tasks[1]: ["a", "dddd"], tasks[2]: ["bb", "eeeee"]}
    assert sorted(seq for tuples in got.values() for _, seq in tuples) == list(range(36))
    assert_no_orphans(run)


def test_an_unknown_grouping_is_named_when_the_topology_is_built():
    b = TopologyBuilder()
    b.set_spout("spout", PythonSpout([["a", 1]], fields=["key", "seq"]))
    b.set_bolt("tag", tag_bolt()).grouping("spout", "test_by_length", fields=["key"])
    with pytest.raises(TopologyError, match="bolt 'tag': unknown grouping 'test_by_length'; use one of"):
        build(b)


def test_all_grouping_every_task_gets_every_tuple():
    topo, items = _grouping_topology("all", 10)
    tasks = topo.components["tag"].tasks
    run = run_topology(topo)
    assert run.result.ok
    got = _received(run)
    assert set(got) == set(tasks)
    for t in tasks:
        assert sorted(seq for _, seq in got[t]) == list(range(10))
    assert run.result.stats["tag"].executed == 30
    assert_no_orphans(run)


def test_global_grouping_only_the_lowest_task():
    topo, items = _grouping_topology("global", 15)
    tasks = topo.components["tag"].tasks
    run = run_topology(topo)
    assert run.result.ok
    got = _received(run)
    assert set(got) == {min(tasks)}
    assert sorted(seq for _, seq in got[min(tasks)]) == list(range(15))
    assert_no_orphans(run)


@pytest.mark.parametrize("kind", ["shuffle", "local_or_shuffle", "none"])
def test_shuffle_like_groupings_spread_over_all_tasks(kind):
    topo, items = _grouping_topology(kind, 30)
    tasks = topo.components["tag"].tasks
    run = run_topology(topo)
    assert run.result.ok
    got = _received(run)
    assert set(got) == set(tasks), "every task gets some"
    assert sorted(seq for tuples in got.values() for _, seq in tuples) == list(range(30)), "each tuple once"
    assert {t: len(v) for t, v in got.items()} == {t: 10 for t in tasks}, "round robin: even load"
    assert_no_orphans(run)


def test_direct_grouping_reaches_exactly_the_chosen_task():
    items: list[list[Any]] = []
    b = TopologyBuilder()
    b.set_spout("spout", PythonSpout(lambda: iter(items), fields=["action", "task", "values"]))
    b.set_bolt("router", ShellBolt(py(CONFORMANCE_PY, "bolt"), fields=["x"])).shuffle_grouping("spout")
    b.set_bolt("sink", tag_bolt(), parallelism=3).direct_grouping("router")
    topo = build(b)
    sink_tasks = topo.components["sink"].tasks
    # The conformance bolt's "emit_direct" action: emit_direct(task, values).
    plan = [(sink_tasks[i % 3] if i % 4 else sink_tasks[2], f"x{i}") for i in range(12)]
    items.extend(["emit_direct", task, [x]] for task, x in plan)
    run = run_topology(topo)
    assert run.result.ok
    got = {r["values"][0]: r["task"] for r in run.records("sink")}
    assert got == {x: task for task, x in plan}
    assert run.result.stats["router"].errors == 0
    assert_no_orphans(run)


# --- the acker end to end ------------------------------------------------------------------------------


def test_tree_completes_only_when_every_descendant_is_acked():
    # The conformance bolt holds "hold" tuples unacked; "release" emits its
    # values anchored to every held tuple and the release, then acks them all.
    items = [
        {"values": ["hold", 1], "id": "h1"},
        {"values": ["hold", 2], "id": "h2"},
        {"values": ["release", ["echo", "r"]], "id": "rel", "after": 1.0},
    ]
    b = TopologyBuilder()
    b.set_spout("spout", scripted_spout(items, ["action", "arg"]))
    b.set_bolt("holder", ShellBolt(py(CONFORMANCE_PY, "bolt"), fields=["a", "b"])).shuffle_grouping("spout")
    b.set_bolt("sink", ShellBolt(py(CONFORMANCE_PY, "bolt"), fields=["a", "b"])).shuffle_grouping("holder")
    run = run_topology(build(b))
    assert run.result.ok, run.result
    ev = run.timed_events()
    names = [(e, m) for _, e, m, _ in ev]
    assert sorted(names) == sorted([("emitted", "h1"), ("emitted", "h2"), ("emitted", "rel"),
                                    ("acked", "h1"), ("acked", "h2"), ("acked", "rel")])
    t_rel = next(t for t, e, m, _ in ev if (e, m) == ("emitted", "rel"))
    idx = {key: i for i, key in enumerate(names)}
    assert idx[("acked", "h1")] > idx[("emitted", "rel")]
    assert idx[("acked", "h2")] > idx[("emitted", "rel")]
    for m in ("h1", "h2", "rel"):
        t_ack = next(t for t, e, mm, _ in ev if (e, mm) == ("acked", m))
        assert t_ack >= t_rel, f"{m} was acked before its descendants existed"
    # The leaf was emitted (and reached the output) before any tree completed.
    sink_out = [i for i, (_, r) in enumerate(run.outputs) if r.get("component") == "sink"]
    first_ack = min(i for i, (_, r) in enumerate(run.outputs)
                    if r.get("stream") == "events" and r["event"] == "acked")
    assert sink_out and sink_out[0] < first_ack
    assert run.result.completed == 3 and run.result.failed == 0
    assert_no_orphans(run)


def test_multi_anchored_tuple_holds_its_tree_open_through_two_anchors():
    # "dup" emits each "hold" tuple twice, so the holder holds two tuples of
    # tree A; the release emits ["hold", "z"] anchored to both and to B's
    # tuple; the sink holds that one forever. Neither tree may complete
    # (spec §7.2): both time out instead.
    items = [
        {"values": ["hold", 1], "id": "A"},
        {"values": ["release", ["hold", "z"]], "id": "B", "after": 0.5},
    ]
    b = TopologyBuilder()
    b.set_spout("spout", scripted_spout(items, ["action", "arg"], replay=False))
    b.set_bolt("dup", PythonBolt(lambda v: [v, v] if v[0] == "hold" else [v], fields=["action", "arg"])) \
        .shuffle_grouping("spout")
    b.set_bolt("holder", ShellBolt(py(CONFORMANCE_PY, "bolt"), fields=["a", "b"])).shuffle_grouping("dup")
    b.set_bolt("sink", ShellBolt(py(CONFORMANCE_PY, "bolt"), fields=["a", "b"])).shuffle_grouping("holder")
    topo = build(b, **{"topology.message.timeout.secs": 2, "multilang.shutdown.grace.secs": 0.2})
    # Stopped once the spout has told of both failures, however late it started.
    run = run_topology(topo, duration=55, limit=60, stop_when=lambda r: sum(e == "failed" for e, _ in r.events()) >= 2)
    ev = run.events()
    assert ("acked", "A") not in ev, "tree A completed while its multi-anchored descendant was unacked"
    assert ("acked", "B") not in ev
    assert ev.count(("failed", "A")) == 1 and ev.count(("failed", "B")) == 1
    assert run.result.timed_out == 2
    assert_no_orphans(run)


def test_fail_anywhere_fails_the_root_once_and_the_spout_replays():
    items = [
        {"values": ["bad"], "id": "x", "replay": ["good"]},
        {"values": ["ok1"], "id": "y"},
        {"values": ["ok2"], "id": "z"},
    ]
    b = TopologyBuilder()
    b.set_spout("spout", scripted_spout(items, ["word"]))
    b.set_bolt("mid", PythonBolt(lambda v: [v], fields=["word"])).shuffle_grouping("spout")
    # Two leaves both fail "bad": two fails in one tree, one fail of the root.
    b.set_bolt("leafA", tag_bolt("--fail-on", "bad")).shuffle_grouping("mid")
    b.set_bolt("leafB", tag_bolt("--fail-on", "bad"), parallelism=2).shuffle_grouping("mid")
    run = run_topology(build(b))
    assert run.result.ok, run.result
    ev = run.events()
    assert [e for e in ev if e[1] == "x"] == [("emitted", "x"), ("failed", "x"), ("emitted", "x"), ("acked", "x")]
    assert [e for e in ev if e[1] == "y"] == [("emitted", "y"), ("acked", "y")]
    assert [e for e in ev if e[1] == "z"] == [("emitted", "z"), ("acked", "z")]
    stats = run.result.stats
    assert run.result.failed == 1 and run.result.completed == 3
    # Each leaf failed "bad", or found its tree already failed by the other
    # and dropped it unsent (§5.3); the root failed once either way.
    assert stats["leafA"].failed + stats["leafA"].expired == 1
    assert stats["leafB"].failed + stats["leafB"].expired == 1
    assert stats["leafA"].failed + stats["leafB"].failed >= 1
    assert stats["spout"].failed == 1 and stats["spout"].acked == 3
    leaf_values = sorted(r["values"][0] for r in run.records("leafA"))
    assert leaf_values in (["bad", "good", "ok1", "ok2"], ["good", "ok1", "ok2"]), "the replay carried its values"
    assert all(s.restarts == 0 for s in stats.values())
    assert_no_orphans(run)


def test_message_timeout_fails_and_replays_and_a_late_ack_is_ignored():
    # The bolt acks "slow" only after 3.5 s, past the 2 s message timeout;
    # the replay ("never") is never acked. So the spout must see the tree
    # fail (not before 2 s) and must never see an ack.
    items = [{"values": ["slow"], "id": "t", "replay": ["never"]}]
    b = TopologyBuilder()
    b.set_spout("spout", scripted_spout(items, ["word"]))
    b.set_bolt("bolt", tag_bolt("--slow-on", "slow:3.5", "--hold-on", "never")).shuffle_grouping("spout")
    topo = build(b, **{"topology.message.timeout.secs": 2, "multilang.shutdown.grace.secs": 0.2})

    async def stop_once_seen(rt):  # the late ack came (and was taken) and the replay reached the bolt
        await wait_until(lambda: rt.stats["bolt"].acked >= 1 and rt.stats["bolt"].executed >= 2, timeout=50)
        rt.request_stop("test")

    run = run_topology(topo, duration=55, during=stop_once_seen)
    ev = run.timed_events()
    emitted = [t for t, e, m, _ in ev if e == "emitted"]
    failed = [t for t, e, m, _ in ev if e == "failed"]
    assert [e for _, e, _, _ in ev if e == "acked"] == [], "a late ack after the timeout completed a tree"
    assert failed, "the timed-out tree was failed"
    assert failed[0] - emitted[0] >= 2.0, "failed no earlier than the timeout"
    assert len(emitted) >= 2, "the spout replayed"
    assert ["never"] in [r["values"] for r in run.records("bolt")], "the replay reached the bolt"
    stats = run.result.stats["bolt"]
    assert stats.acked >= 1, "the late ack was accepted from the bolt (not a protocol error) ..."
    assert run.result.completed == 0, "... and ignored by the acker"
    assert run.result.timed_out >= 1
    assert stats.restarts == 0 and stats.errors == 0
    assert_no_orphans(run)


# In-process components under a MockClock: virtual time makes the 30 s
# default timeout instant and exact.


def _lossy_topology(n: int):
    seen: list[tuple[float, list[Any]]] = []
    b = TopologyBuilder()
    b.set_spout("spout", PythonSpout([[i] for i in range(n)], fields=["n"]))
    b.set_bolt("relay", PythonBolt(lambda v: [v], fields=["n"])).shuffle_grouping("spout")
    b.set_bolt("sink", PythonBolt(lambda v: seen.append((trio.current_time(), v)) or [], fields=["n"])) \
        .shuffle_grouping("relay")
    return b.create_topology({"topology.message.timeout.secs": 30}), seen


def _intercept_first(rt: Runtime, component: str, value: list[Any], on_first: Callable[[Any], None]) -> list[float]:
    """Divert the first delivery of ``value`` to ``component`` (a tuple lost
    on its way); later deliveries pass. Returns the times of each delivery."""
    task = task_of(rt, component)
    original = task.deliver
    times: list[float] = []

    def deliver(d):
        if d.values == value:
            times.append(trio.current_time())
            if len(times) == 1:
                on_first(d)
                return
        original(d)

    task.deliver = deliver
    return times


def test_mockclock_lost_tuple_times_out_exactly_and_is_replayed():
    topo, seen = _lossy_topology(5)

    async def main():
        rt = Runtime(topo)
        times = _intercept_first(rt, "sink", [2], lambda d: None)
        start = trio.current_time()
        result = await rt.run(until_done=True)
        return rt, result, times, start

    rt, result, times, start = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(times) == 2, "delivered, lost, then replayed once"
    assert 30 <= times[1] - times[0] <= 31.1, "failed at the timeout, within about a second"
    assert sorted(v[0] for _, v in seen) == [0, 1, 2, 3, 4]
    assert result.ok
    assert result.timed_out == 1 and result.failed == 1 and result.completed == 5
    assert result.stats["spout"].failed == 1 and result.stats["spout"].acked == 5


def test_mockclock_a_tuple_queued_after_its_tree_timed_out_is_dropped_unsent():
    # Issue 18: a tuple whose tree already timed out (and was replayed) must
    # never be delivered afterwards: processing it would duplicate the replay.
    topo, seen = _lossy_topology(3)
    held = []

    async def main():
        rt = Runtime(topo)
        times = _intercept_first(rt, "sink", [1], held.append)

        async def deliver_late():
            await trio.sleep(45)  # past the 30 s timeout and the replay
            task_of(rt, "sink").inbox.append(held[0])
            task_of(rt, "sink").kick()

        async with trio.open_nursery() as n:
            n.start_soon(deliver_late)
            result = await rt.run(duration=60)
            n.cancel_scope.cancel()
        return rt, result, times

    rt, result, times = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(times) == 2 and held
    assert sorted(v[0] for _, v in seen) == [0, 1, 2], "the stale copy was not processed"
    assert result.stats["sink"].expired == 1
    assert result.timed_out == 1 and result.failed == 1
    assert result.completed == 3
    assert result.stats["spout"].acked == 3 and result.stats["spout"].failed == 1
    assert result.pending == 0


# --- flow control -------------------------------------------------------------------------------------


def test_max_spout_pending_is_honoured():
    limit = 3
    items = [{"values": [f"w{i}"], "id": i} for i in range(30)]
    b = TopologyBuilder()
    b.set_spout("spout", scripted_spout(items, ["word"]))
    b.set_bolt("bolt", tag_bolt("--sleep", "0.02"), parallelism=2).shuffle_grouping("spout")
    topo = build(b, **{"topology.max.spout.pending": limit})
    sampled: list[int] = []

    async def sample(rt: Runtime) -> None:
        task_id = rt.topology.components["spout"].tasks[0]
        while True:
            sampled.append(rt.acker.pending_for(task_id))
            await trio.sleep(0.001)

    run = run_topology(topo, during=sample)
    assert run.result.ok
    ev = run.timed_events()
    outstanding = [n for _, e, _, n in ev if e == "emitted"]
    assert len(outstanding) == 30
    assert max(outstanding) == limit, f"the spout had {max(outstanding)} trees in flight (limit {limit})"
    assert max(sampled) <= limit
    assert sorted(m for _, e, m, _ in ev if e == "acked") == list(range(30))
    assert_no_orphans(run)


def test_max_spout_pending_in_process_spout():
    limit = 4
    seen_pending: list[int] = []
    rt_box: list[Runtime] = []

    def sink(v):
        rt = rt_box[0]
        seen_pending.append(rt.acker.pending_for(rt.topology.components["spout"].tasks[0]))
        return []

    b = TopologyBuilder()
    b.set_spout("spout", PythonSpout([[i] for i in range(200)], fields=["n"]))
    b.set_bolt("sink", PythonBolt(sink, fields=["n"])).shuffle_grouping("spout")
    topo = b.create_topology({"topology.max.spout.pending": limit})

    async def main():
        rt = Runtime(topo)
        rt_box.append(rt)
        return await rt.run(until_done=True)

    result = trio.run(main)
    assert result.ok and result.completed == 200
    assert len(seen_pending) == 200 and max(seen_pending) <= limit


@pytest.mark.parametrize("extensions", [[], ["batch"], ["msgpack"]], ids=["json", "batch", "msgpack"])
def test_a_tuple_too_large_for_the_bolts_reader_is_failed_by_name_and_the_others_go_on(extensions):
    # §1.3: the host never writes a frame the bolt's reader would refuse; the
    # tuple is failed (its spout replays it, then gives up: a dead letter).
    big = "y" * 3000
    b = TopologyBuilder()
    b.set_spout("spout", PythonSpout([["a"], [big], ["b"]], fields=["word"]))
    b.set_bolt("bolt", tag_bolt(), conf={"multilang.max.frame.bytes": 2000,
                                         "multilang.extensions": extensions}).shuffle_grouping("spout")
    run = run_topology(build(b, **{"multilang.max.replays": 1}))
    assert sorted(r["values"][0] for r in run.records("bolt")) == ["a", "b"]
    res = run.result
    assert res.dead_letters == 1 and res.stats["bolt"].restarts == 0
    (letter,) = res.dead_letter_sample
    assert letter.input == [big] and letter.attempts == 2
    assert "exceeds the reader's 2000-byte limit (multilang.max.frame.bytes" in letter.cause, letter.cause
    assert_no_orphans(run)


def test_acking_disabled_spout_gets_ack_for_every_reliable_emit_after_sync():
    # need_task_ids makes the spout wait for task ids after each emit: an ack
    # written before them (Storm's re-entrant ack, §4.7) would break it.
    items = [{"values": [w], "id": i} for i, w in enumerate(["a", "bad", "b", "c", "bad"])]
    items.append({"values": ["unreliable"]})
    b = TopologyBuilder()
    b.set_spout("spout", scripted_spout(items, ["word"], need_task_ids=True))
    b.set_bolt("bolt", tag_bolt("--fail-on", "bad"), parallelism=2).shuffle_grouping("spout")
    topo = build(b, **{"topology.acker.executors": 0})
    run = run_topology(topo)
    ev = run.events()
    acked = [m for e, m in ev if e == "acked"]
    assert sorted(acked) == [0, 1, 2, 3, 4], "every reliable emit acked once, failed bolts notwithstanding"
    assert [e for e in ev if e[0] == "failed"] == []
    for i in range(5):
        kinds = [e for e, m in ev if m == i]
        assert kinds == ["emitted", "acked"]
    task_ids = [m for e, m in ev if e == "task_ids"]
    assert len(task_ids) == 6 and all(len(ids) == 1 for ids in task_ids)
    assert run.result.failed == 0 and run.result.timed_out == 0 and run.result.pending == 0
    assert run.result.stats["bolt"].failed == 2
    assert run.result.stats["spout"].acked == 5  # (the acks it got, as Storm's spout counts them: was 0)
    assert all(s.restarts == 0 and s.errors == 0 for s in run.result.stats.values())
    assert_no_orphans(run)


def test_max_tuples_stops_after_that_many_spout_tuples_shell_spout():
    items = [{"values": [f"w{i}"], "id": i} for i in range(40)]
    b = TopologyBuilder()
    # No event reports: every spout emit counts toward max_tuples.
    b.set_spout("spout", scripted_spout(items, ["word"], events=False))
    b.set_bolt("bolt", tag_bolt()).shuffle_grouping("spout")
    run = run_topology(build(b), max_tuples=10, limit=120)
    assert run.result.ok
    assert run.result.stats["spout"].emitted == 10
    assert run.result.completed == 10 and run.result.stats["spout"].acked == 10
    assert sorted(r["values"][0] for r in run.records("bolt")) == [f"w{i}" for i in range(10)]
    assert_no_orphans(run)


def test_max_tuples_stops_after_that_many_spout_tuples_python_spout():
    b = TopologyBuilder()
    b.set_spout("spout", PythonSpout([[i] for i in range(1000)], fields=["n"]))
    b.set_bolt("bolt", tag_bolt()).shuffle_grouping("spout")
    run = run_topology(build(b), max_tuples=25, limit=120)
    assert run.result.ok
    assert run.result.stats["spout"].emitted == 25 and run.result.completed == 25
    assert sorted(r["values"][0] for r in run.records("bolt")) == list(range(25))
    assert_no_orphans(run)


def test_max_tuples_counts_inputs_not_the_replays_of_one_that_fails():
    # An input that fails is replayed (multilang.max.replays, 3), then given up on; its replays are not
    # new inputs: --max-tuples 25 takes the first 25 (one input in flight at a time, the replays come
    # before the limit: they took three of the inputs' places before).
    b = TopologyBuilder()
    b.set_spout("spout", PythonSpout([[f"w{i}"] for i in range(1000)], fields=["w"]))
    b.set_bolt("bolt", tag_bolt("--fail-on", "w3")).shuffle_grouping("spout")
    run = run_topology(build(b, **{"topology.max.spout.pending": 1}), max_tuples=25, limit=120)
    got = Counter(r["values"][0] for r in run.records("bolt"))
    assert sorted(got, key=lambda w: int(w[1:])) == [f"w{i}" for i in range(25)]
    assert got["w3"] == 4 and run.result.dead_letters == 1
    assert run.result.stats["spout"].emitted == 28 and run.result.completed == 24
    assert_no_orphans(run)


# --- ticks ---------------------------------------------------------------------------------------------


def test_tick_tuples_reach_the_configured_bolt_only():
    b = TopologyBuilder()
    b.set_spout("spout", PythonSpout([], fields=["x"]))
    b.set_bolt("ticker", ShellBolt(py(CONFORMANCE_PY, "bolt"), fields=["a", "b"]),
               conf={"topology.tick.tuple.freq.secs": 1}).shuffle_grouping("spout")
    b.set_bolt("quiet", ShellBolt(py(CONFORMANCE_PY, "bolt"), fields=["a", "b"])).shuffle_grouping("spout")

    async def stop_after_two_ticks(rt):
        await wait_until(lambda: rt.stats["ticker"].acked >= 2, timeout=50)
        rt.request_stop("test")

    run = run_topology(build(b), duration=55, during=stop_after_two_ticks)
    ticks = [(r["a"], r["b"]) for r in run.records("ticker")]
    assert len(ticks) >= 2 and set(ticks) == {("tick", 1)}
    assert run.records("quiet") == []
    s = run.result.stats["ticker"]
    assert s.acked >= 2 and s.failed == 0 and s.restarts == 0
    assert_no_orphans(run)


# --- heartbeats and supervision ------------------------------------------------------------------------


def test_stopped_bolt_is_killed_after_subprocess_timeout_restarted_and_its_tuples_replayed(caplog):
    n = 20
    items = [{"values": [f"w{i}"], "id": i} for i in range(n)]
    b = TopologyBuilder()
    b.set_spout("spout", scripted_spout(items, ["word"]))
    b.set_bolt("bolt", tag_bolt("--sleep", "0.05")).shuffle_grouping("spout")
    topo = build(b, **{"topology.subprocess.timeout.secs": 2})
    stopped: list[int] = []

    async def stopper(rt: Runtime) -> None:
        task = task_of(rt, "bolt")
        # Our Python library flushes its output only when it next reads, so
        # "output flowed" is a poor signal; tuples written to it are enough.
        await wait_until(lambda: task.proc is not None and len(task.in_flight) >= 5)
        pid = task.proc.proc.pid
        os.kill(pid, signal.SIGSTOP)  # stops reading and answering heartbeats; never continued
        stopped.append(pid)

    run = run_topology(topo, during=stopper, limit=120)
    res = run.result
    assert stopped
    assert res.ok, res
    assert res.stats["bolt"].restarts == 1
    assert res.stats["bolt"].failed >= 1, "its in-flight tuples were failed"
    ev = run.events()
    failed = {m for e, m in ev if e == "failed"}
    assert failed, "the spout was told"
    acked = [m for e, m in ev if e == "acked"]
    assert sorted(acked) == list(range(n)), "every tuple acked exactly once in the end (replayed)"
    for m in failed:
        kinds = [e for e, mm in ev if mm == m]
        assert kinds[-1] == "acked" and kinds.count("failed") >= 1
    assert gone(stopped[0]), "the stopped process was killed and reaped"
    reasons = [r.getMessage() for r in caplog.records if "restarting" in r.getMessage()]
    assert len(reasons) == 1 and "subprocess timeout" in reasons[0] and str(stopped[0]) in reasons[0], reasons
    assert_no_orphans(run)


def test_busy_bolt_working_through_a_backlog_is_not_killed_as_hung():
    # 8 tuples at 0.4 s each reach the bolt at once: 3.2 s of honest work,
    # longer than the 2 s subprocess timeout. A bolt that acks as it goes
    # (every frame counts as liveness, §5.2) must not be taken for a hung one.
    items = [{"values": [f"w{i}"], "id": i} for i in range(8)]
    b = TopologyBuilder()
    b.set_spout("spout", scripted_spout(items, ["word"]))
    b.set_bolt("bolt", tag_bolt("--sleep", "0.4")).shuffle_grouping("spout")
    topo = build(b, **{"topology.subprocess.timeout.secs": 2, "multilang.restart.budget": 1})
    run = run_topology(topo, limit=120)
    stats = run.result.stats["bolt"]
    assert stats.restarts == 0 and not run.result.gave_up, "a busy bolt was killed as hung"
    assert run.result.ok and run.result.completed == 8 and run.result.failed == 0
    assert_no_orphans(run)


def test_missing_command_raises_topology_error_naming_the_component():
    b = TopologyBuilder()
    b.set_spout("spout", PythonSpout([["a"]], fields=["x"]))
    b.set_bolt("ghost", ShellBolt(["no-such-program-xyz"], fields=["x"])).shuffle_grouping("spout")
    topo = build(b)

    async def main():
        with trio.fail_after(10):
            await Runtime(topo).run(until_done=True)

    with pytest.raises(TopologyError, match=r"bolt 'ghost': command 'no-such-program-xyz' not found"):
        trio.run(main)
    assert child_pids(os.getpid()) == []


def test_crashing_bolt_gives_up_after_its_restart_budget():
    # The conformance bolt's "exit" action exits at once; every replay
    # kills the next process too, until the budget is spent.
    items = [{"values": ["exit", 3], "id": "boom"}]
    b = TopologyBuilder()
    b.set_spout("spout", scripted_spout(items, ["action", "code"]))
    b.set_bolt("bolt", ShellBolt(py(CONFORMANCE_PY, "bolt"), fields=["a"])).shuffle_grouping("spout")
    topo = build(b, **{"multilang.restart.budget": 2})
    run = run_topology(topo, limit=120)
    res = run.result
    assert not res.ok and res.gave_up
    err = res.gave_up[0]
    msg = str(err)
    assert "bolt" in msg and "exit status 3" in msg
    assert res.stats["bolt"].restarts == 2
    assert_no_orphans(run)


# --- extension msgpack (§9.6) through the whole runtime ------------------------------------


@pytest.mark.parametrize("offer", [["msgpack"], ["batch", "msgpack"]])
def test_wordcount_in_python_over_msgpack_gives_exact_counts(offer):
    """Python spout, split and count over length-prefixed msgpack frames
    (with and without batch): the same exact counts as over JSON."""
    b = TopologyBuilder()
    b.set_spout("sentences", ShellSpout(LANG["python"]("sentence_spout") + ["data/alice.txt"], fields=["sentence"]))
    b.set_bolt("split", ShellBolt(LANG["python"]("split_bolt"), fields=["word"]), parallelism=2) \
        .shuffle_grouping("sentences")
    b.set_bolt("count", ShellBolt(LANG["python"]("count_bolt"), fields=["word", "count"]), parallelism=2) \
        .fields_grouping("split", ["word"])
    topo = b.create_topology({"topology.max.spout.pending": 200, "multilang.extensions": offer},
                             resource_dir=EXAMPLES, output=OutputSpec(component="count", key=["word"]))
    negotiated = []

    async def note(rt):
        import trio
        while len(negotiated) < 5:
            negotiated[:] = [t.proc.conn.extensions for t in rt.tasks.values()
                             if getattr(t, "proc", None) is not None and t.proc.conn.extensions]
            await trio.sleep(0.01)

    run = run_topology(topo, limit=120, during=note)
    assert run.result.ok, run.result
    assert {r["word"]: r["count"] for r in run.result.outputs} == expected_wordcount()
    assert negotiated == [tuple(offer)] * 5
    assert_no_orphans(run)


@pytest.mark.parametrize("offer", [[], ["batch"], ["batch", "msgpack"]])
def test_batch_level_python_bolt_every_input_once_failures_replayed(offer):
    """Bolt.process_batch as a real subprocess, in every protocol mode: each
    input comes out once, upper-cased and anchored to its tree; a failed
    input fails its tree and the spout replays it; ticks still reach
    process_tick."""
    words = [f"w{i}" for i in range(300)] + ["bad"]
    items = [{"values": [w], "id": i} for i, w in enumerate(words)]
    b = TopologyBuilder()
    b.set_spout("spout", scripted_spout(items, ["word"]))
    b.set_bolt("upper", ShellBolt(py(COMPONENTS / "upper_batch_bolt.py"), fields=["word"])) \
        .shuffle_grouping("spout")
    topo = build(b, **{"multilang.extensions": offer, "topology.tick.tuple.freq.secs": 1})

    async def stop_when_all_came_out(rt):  # the pass condition is what was delivered, however long it takes
        spout, upper = rt.stats["spout"], rt.stats["upper"]
        await wait_until(lambda: spout.acked >= 300 and spout.failed >= 1 and upper.emitted >= 301, timeout=50)
        rt.request_stop("test")

    run = run_topology(topo, limit=120, duration=55, during=stop_when_all_came_out)
    res = run.result
    got = [r["word"] for r in run.records("upper")]
    assert sorted(w for w in got if w != "tick") == sorted(w.upper() for w in words[:-1])
    assert "tick" in got
    fails = [m for e, m in run.events() if e == "failed"]
    assert fails and set(fails) == {len(words) - 1}  # only "bad", failed and replayed
    assert res.stats["upper"].restarts == 0
    assert_no_orphans(run)


_BATCH_ECHO = """\
from multilang import Bolt

class Echo(Bolt):
    def process_batch(self, tuples):
        self.emit_many(tuples.values, anchors=tuples.ids)
        self.ack_many(tuples.ids)

Echo().run()
"""


@pytest.mark.parametrize("offer", [[], ["batch"], ["batch", "msgpack"]])
def test_batch_level_echo_passes_any_values_through_in_every_mode(offer, tmp_path):
    """A process_batch echo (emit_many / ack_many on the columns) under our
    host: every input comes out once, values intact, under its own root.
    Integers such as 50372 = 0xc4c4 hold bytes that look like msgpack
    bin/ext markers, which makes the writer check the data model of a whole
    output batch; its elements (built as tuples) must pass."""
    script = tmp_path / "echo.py"
    script.write_text(_BATCH_ECHO)
    rows = [[f"w{i}", 0xC4C4 + i, {"k": [i, None]}] for i in range(500)]
    b = TopologyBuilder()
    b.set_spout("spout", PythonSpout(rows, fields=["word", "n", "m"]))
    b.set_bolt("echo", ShellBolt(["python", str(script)], fields=["word", "n", "m"])).shuffle_grouping("spout")
    topo = b.create_topology({"multilang.extensions": offer})
    got: list[tuple[list, list]] = []
    rt = Runtime(topo, on_tracked_output=lambda c, s, values, roots: got.append((list(values), list(roots))))

    async def main():
        with trio.fail_after(60):
            return await rt.run(until_done=True)

    res = trio.run(main)
    assert res.ok and res.completed == 500 and res.failed == 0, res
    assert sorted((v for v, _ in got), key=lambda v: v[1]) == rows
    assert len({r for _, (r,) in got}) == 500
    assert rt.stats["echo"].restarts == 0 and rt.stats["echo"].errors == 0


@needs_ruby_node
def test_wordcount_across_languages_over_msgpack_and_batch():
    """Python spout, Ruby split, Node count, all speaking batch + msgpack
    (§9.5, §9.6) with the host: exact counts, and every process accepted both."""
    b = TopologyBuilder()
    b.set_spout("sentences", ShellSpout(LANG["python"]("sentence_spout") + ["data/alice.txt"], fields=["sentence"]))
    b.set_bolt("split", ShellBolt(LANG["ruby"]("split_bolt"), fields=["word"]), parallelism=2) \
        .shuffle_grouping("sentences")
    b.set_bolt("count", ShellBolt(LANG["node"]("count_bolt"), fields=["word", "count"]), parallelism=2) \
        .fields_grouping("split", ["word"])
    topo = b.create_topology({"topology.max.spout.pending": 200, "multilang.extensions": ["batch", "msgpack"]},
                             resource_dir=EXAMPLES, output=OutputSpec(component="count", key=["word"]))
    seen: dict[int, tuple[str, ...]] = {}

    async def note(rt):
        import trio
        while True:
            for tid, t in rt.tasks.items():
                if getattr(t, "proc", None) is not None and t.proc.conn.extensions:
                    seen[tid] = t.proc.conn.extensions
            await trio.sleep(0.01)

    run = run_topology(topo, limit=120, during=note)
    assert run.result.ok, run.result
    assert {r["word"]: r["count"] for r in run.result.outputs} == expected_wordcount()
    assert len(seen) == 5 and set(seen.values()) == {("batch", "msgpack")}
    assert_no_orphans(run)


# A split bolt on our library that emits one wrong-arity tuple (2 values on a
# 1-field stream) for the sentence "bad arity here", the first time only.
_ONCE_WRONG_ARITY_SPLIT = """\
import os, sys
from multilang import Bolt

MARKER = sys.argv[1]

class Split(Bolt):
    def process(self, tup):
        sentence = tup.values[0]
        if sentence == "bad arity here" and not os.path.exists(MARKER):
            open(MARKER, "w").close()
            self.emit([sentence, "extra"], anchors=[tup])
        for w in sentence.split():
            self.emit([w], anchors=[tup])
        self.ack(tup)

Split().run()
"""


@pytest.mark.parametrize("offer", [[], ["batch"]], ids=["standard", "batch"])
def test_tracked_outputs_carry_their_root_and_a_bad_output_fails_only_its_tree(offer, tmp_path, caplog):
    """Outputs of a bolt on a stream nobody subscribes to, with tracked
    outputs on (the Spark engine's and bench/'s setup): each reaches
    ``on_tracked_output`` with the root of its input, in emit order, and is
    counted as emitted. A wrong-arity output is refused: the error names the
    component and task, that input's tree fails, the spout replays it, and
    the replay's outputs come under a new root."""
    script = tmp_path / "split.py"
    script.write_text(_ONCE_WRONG_ARITY_SPLIT)
    sentences = [f"s{i} w{i} x{i}" for i in range(300)]
    sentences[123] = "bad arity here"
    b = TopologyBuilder()
    b.set_spout("spout", PythonSpout([[s] for s in sentences], fields=["sentence"]))
    b.set_bolt("split", ShellBolt(["python", str(script), str(tmp_path / "marker")], fields=["word"])) \
        .shuffle_grouping("spout")
    topo = b.create_topology({"multilang.extensions": offer})
    got: list[tuple[str, list, list, bool]] = []

    def on_output(component: str, stream: str, values: list, roots: list) -> None:
        # alive: the tree has not failed (the Spark engine drops the outputs of a failed tree)
        got.append((f"{component}/{stream}", list(values), list(roots), all(r in rt.acker.roots for r in roots)))

    rt = Runtime(topo, on_tracked_output=on_output)
    res = trio.run(lambda: rt.run(until_done=True))
    assert res.ok and res.completed == 300 and res.failed == 1, res
    assert {where for where, *_ in got} == {"split/default"}
    assert all(len(roots) == 1 for _, _, roots, _ in got)
    alive: dict[int, list[str]] = defaultdict(list)
    for _, values, (root,), ok in got:
        if ok:
            alive[root].append(values[0])
    # every sentence once, each under its own root, its words in emit order
    assert sorted(" ".join(words) for words in alive.values()) == sorted(sentences)
    # the refused attempt's later words came under its failed root, and nothing else did
    assert [values for _, values, _, ok in got if not ok] == [["bad"], ["arity"], ["here"]]
    assert rt.stats["split"].emitted == len(got)  # the refused tuple is not counted
    assert rt.stats["split"].errors == 1 and rt.stats["split"].restarts == 0
    (err,) = [r.getMessage() for r in caplog.records if "emitted 2 values" in r.getMessage()]
    assert err.startswith("split:1 (pid ") and "which declares 1 fields" in err and "tree failed" in err


def test_an_output_without_a_key_and_no_on_output_is_warned_about_not_silently_empty(caplog):
    # A user's first Python API run: OutputSpec(component=...) without key,
    # and no on_output; result.outputs is the keyed view, so it is empty.
    b = TopologyBuilder()
    b.set_spout("s", PythonSpout([[1], [2]], fields=["n"]))
    b.set_bolt("c", PythonBolt(lambda v: [v], fields=["n"])).shuffle_grouping("s")
    topo = b.create_topology({}, output=OutputSpec(component="c"))
    with caplog.at_level(logging.WARNING, logger="multilang.shellbolt"):
        result = trio.run(lambda: Runtime(topo).run(until_done=True))
    assert result.outputs == []
    assert any("has no key and this Runtime has no on_output" in r.getMessage() for r in caplog.records)
    records: list = []
    caplog.clear()
    trio.run(lambda: Runtime(topo, on_output=records.append).run(until_done=True))
    assert sorted(r["n"] for r in records) == [1, 2]
    assert not any("no on_output" in r.getMessage() for r in caplog.records)


class _Seen:
    """A callable bolt that keeps state: passes each word once."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, values: list[Any]) -> list[list[Any]]:
        if values[0] in self.seen:
            return []
        self.seen.add(values[0])
        return [[values[0]]]


def test_a_python_bolts_state_is_its_runs_own_so_a_second_run_starts_afresh():
    # A task calls its own copy of the function: a second run of the same
    # topology object passed nothing (the first run's words were "seen").
    b = TopologyBuilder()
    b.set_spout("s", PythonSpout([["a"], ["b"], ["a"]], fields=["w"]))
    b.set_bolt("d", PythonBolt(_Seen(), fields=["w"])).shuffle_grouping("s")
    topo = b.create_topology({}, output=OutputSpec(component="d"))
    for _ in range(2):
        out: list[dict] = []
        trio.run(lambda: Runtime(topo, on_output=out.append).run(until_done=True))
        assert sorted(o["w"] for o in out) == ["a", "b"]
