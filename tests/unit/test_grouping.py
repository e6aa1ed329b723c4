"""Stream groupings (shellbolt/_model/grouping.py): pure task choice per emit."""

from __future__ import annotations

import zlib
from collections import Counter

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multilang.shellbolt import fields_task_index
from multilang.errors import TopologyError
from multilang.shellbolt._model.grouping import GROUPINGS, Grouping, Router, new_grouping, register_grouping

json_scalars = st.one_of(
    st.text(max_size=12),
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False),
)


# --- fields ---------------------------------------------------------------------------


def test_fields_task_index_is_the_documented_crc32_mapping():
    # CRC-32 of the compact JSON of the key list, modulo the number of tasks.
    for key in (["alice"], ["the"], [1, "x"], [None], ["ünïcode"], [[1, 2], {"a": 1}]):
        for n in (1, 2, 3, 7):
            assert fields_task_index(key, n) == zlib.crc32(orjson.dumps(key)) % n
    # Pinned values: changing the mapping would repartition every running job
    # (and the Spark engine must agree with the embedded one).
    # The bytes hashed are compact JSON: b'["alice"]' (CRC-32 3194947885).
    assert [fields_task_index(["alice"], n) for n in (2, 3, 4, 7)] == [1, 1, 1, 3]
    assert [fields_task_index(["the"], n) for n in (2, 3, 4, 7)] == [1, 0, 3, 0]
    assert [fields_task_index([1, "x"], n) for n in (2, 3, 4, 7)] == [0, 2, 2, 5]
    assert fields_task_index(["alice"], 1) == 0
    assert fields_task_index(("alice",), 5) == fields_task_index(["alice"], 5)


@settings(max_examples=200, deadline=None)
@given(key=st.lists(json_scalars, min_size=1, max_size=3), n=st.integers(1, 16))
def test_fields_same_key_same_task_across_grouping_instances(key, n):
    tasks = list(range(10, 10 + n))
    g1 = new_grouping("fields", "count", tasks, field_index=list(range(len(key))))
    g2 = new_grouping("fields", "count", list(tasks), field_index=list(range(len(key))))
    first = g1.choose(list(key))
    assert len(first) == 1 and first[0] in tasks
    for _ in range(3):
        assert g1.choose(list(key)) == first
        assert g2.choose(list(key)) == first
    assert first == [tasks[fields_task_index(key, n)]]


def test_fields_uses_only_the_grouped_fields():
    g = new_grouping("fields", "count", [3, 4, 5], field_index=[1])
    base = g.choose(["a", "word", 1])
    for other in (["b", "word", 2], [None, "word", {"x": 1}], [0, "word", []]):
        assert g.choose(other) == base
    assert base == [[3, 4, 5][fields_task_index(["word"], 3)]]


def test_fields_multiple_fields_in_declared_order():
    g = new_grouping("fields", "t", [1, 2, 3, 4, 5], field_index=[2, 0])
    values = ["x", "ignored", "y"]
    assert g.choose(values) == [[1, 2, 3, 4, 5][fields_task_index(["y", "x"], 5)]]


def test_fields_keys_spread_over_all_tasks():
    tasks = [2, 3, 4, 5]
    g = new_grouping("fields", "count", tasks, field_index=[0])
    load = Counter(g.choose([f"word{i}"])[0] for i in range(2000))
    assert set(load) == set(tasks)
    # roughly even: every task gets at least half its fair share
    assert min(load.values()) > 2000 / len(tasks) / 2


def test_fields_index_is_into_ascending_task_list():
    # Task ids need not start at 1 or be dense across components.
    g = new_grouping("fields", "count", [7, 8, 9], field_index=[0])
    for w in ("a", "b", "c", "d", "e"):
        assert g.choose([w]) == [[7, 8, 9][fields_task_index([w], 3)]]


# --- all / global / direct ----------------------------------------------------------------


def test_all_goes_to_every_task():
    g = new_grouping("all", "t", [4, 5, 6])
    for v in (["a"], ["b"], [1]):
        assert g.choose(v) == [4, 5, 6]
    # The result is a fresh list, not the grouping's own.
    g.choose(["x"]).append(99)
    assert g.choose(["y"]) == [4, 5, 6]


def test_global_goes_to_the_lowest_task():
    g = new_grouping("global", "t", [4, 5, 6])
    assert {tuple(g.choose([i])) for i in range(50)} == {(4,)}


def test_direct_choose_returns_no_task():
    g = new_grouping("direct", "t", [4, 5, 6])
    assert g.choose(["a"]) == []


def test_an_unknown_kind_is_a_topology_error_naming_the_kinds():
    with pytest.raises(TopologyError, match=r"unknown grouping 'bogus'; use one of \['all', 'direct', 'fields'"):
        new_grouping("bogus", "t", [1])
    with pytest.raises(TopologyError) as info:
        new_grouping("shufle", "t", [1])
    assert str(info.value) == ("unknown grouping 'shufle'; did you mean 'shuffle'? (one of ['all', 'direct', 'fields', "
                               "'global', 'local_or_shuffle', 'none', 'shuffle'])")


# --- shuffle-like ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["shuffle", "local_or_shuffle", "none"])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_shuffle_like_is_even_round_robin(kind, n):
    tasks = list(range(20, 20 + n))
    g = new_grouping(kind, "t", tasks)
    rounds = 7
    picks = [g.choose(["v", i]) for i in range(rounds * n)]
    assert all(len(p) == 1 for p in picks)
    load = Counter(p[0] for p in picks)
    assert load == {t: rounds for t in tasks}
    # Every window of n consecutive picks covers every task once.
    flat = [p[0] for p in picks]
    for i in range(0, len(flat) - n + 1):
        assert sorted(flat[i:i + n]) == tasks


def test_shuffle_ignores_values():
    g = new_grouping("shuffle", "t", [1, 2])
    assert {g.choose(["same"])[0] for _ in range(4)} == {1, 2}


def test_separate_shuffle_groupings_balance_independently():
    a = new_grouping("shuffle", "t", [1, 2, 3])
    b = new_grouping("shuffle", "t", [1, 2, 3])
    for _ in range(3):
        b.choose(["x"])
    assert Counter(a.choose(["x"])[0] for _ in range(9)) == {1: 3, 2: 3, 3: 3}


# --- names and router --------------------------------------------------------------------------


def test_groupings_table_matches_storm_context_types():
    assert {kind: cls.storm_type for kind, cls in GROUPINGS.items()} == {
        "shuffle": "SHUFFLE",
        "fields": "FIELDS",
        "all": "ALL",
        "global": "FIELDS",
        "none": "NONE",
        "direct": "DIRECT",
        "local_or_shuffle": "LOCAL_OR_SHUFFLE",
    }


def test_router_subscribers_and_direct_targets():
    r = Router()
    g1 = new_grouping("shuffle", "a", [2, 3])
    g2 = new_grouping("direct", "b", [4, 5])
    g3 = new_grouping("all", "c", [6])
    r.add("spout", "default", g1)
    r.add("spout", "default", g2)
    r.add("spout", "other", g3)
    assert r.subscribers("spout", "default") == [g1, g2]
    assert r.subscribers("spout", "other") == [g3]
    assert r.subscribers("spout", "missing") == []
    assert r.subscribers("nobody", "default") == []
    assert r.direct_targets("spout", "default") == {4, 5}
    assert r.direct_targets("spout", "other") == set()


_ONE_TASK_KINDS = ["shuffle", "local_or_shuffle", "none", "fields", "global"]


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(_ONE_TASK_KINDS), n_tasks=st.integers(1, 5), start=st.integers(0, 4),
       runs=st.lists(st.lists(st.tuples(st.text(max_size=3), st.integers(-5, 5)), max_size=8), max_size=4))
def test_choose_each_picks_what_choose_picks_tuple_by_tuple(kind, n_tasks, start, runs):
    """The burst path (an in-process spout's run of emits) against the
    per-emit path: the same tasks, and the round-robin left where it would be."""
    tasks = [10 + 3 * i for i in range(n_tasks)]
    one = new_grouping(kind=kind, target="b", tasks=tasks, field_index=[0] if kind == "fields" else [])
    each = new_grouping(kind=kind, target="b", tasks=tasks, field_index=one.field_index)
    one._next = each._next = start % n_tasks
    for run in runs:
        values_list = [list(v) for v in run]
        assert each.choose_each(values_list) == [t for v in values_list for t in one.choose(v)]
    assert each._next == one._next


@pytest.mark.parametrize("kind", ["all", "direct"])
def test_choose_each_refuses_a_kind_that_does_not_pick_one_task(kind):
    with pytest.raises(ValueError, match=kind):
        new_grouping(kind=kind, target="b", tasks=[1, 2]).choose_each([["x"]])


def test_a_class_is_registered_once_per_kind_and_must_name_its_kind():
    class Again(Grouping):
        kind, storm_type = "shuffle", "SHUFFLE"

    with pytest.raises(ValueError, match="registered already"):
        register_grouping(Again)
    with pytest.raises(ValueError, match="a kind and a storm_type"):
        register_grouping(type("Nameless", (Grouping,), {}))
