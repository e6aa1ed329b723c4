"""multilang.KeyValueState (spec/PROTOCOL.md §9.7): the map, its checks, and
the bookkeeping of a checkpoint (dirty keys, the undo record, chunks), with
no process: StatefulBolt drives the same methods from its loop
(tests/integration/test_python_stateful.py runs them through real processes)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multilang import KeyValueState
from multilang._kv_state import CHUNK_BYTES, CHUNK_KEYS


def prepared(state, **kw):
    """The one chunk of a prepare, as (put, sorted delete)."""
    chunks = state._prepare(**kw)
    assert len(chunks) == 1, chunks
    put, delete = chunks[0]
    return put, sorted(delete)


def snapshot(state):
    return dict(state.items())


# -- the map -------------------------------------------------------------------


def test_get_put_delete_contains_len_keys_items():
    s = KeyValueState()
    assert s.get("a") is None and s.get("a", 0) == 0 and len(s) == 0 and "a" not in s
    s.put("a", 1)
    s.put("b", [1, {"x": None}])
    s.put("c", "text")
    assert s.get("a") == 1 and "a" in s and len(s) == 3
    assert s.keys() == ["a", "b", "c"] and list(s) == ["a", "b", "c"]
    assert s.items() == [("a", 1), ("b", [1, {"x": None}]), ("c", "text")]
    s.delete("b")
    s.delete("never-there")  # nothing happens
    assert s.keys() == ["a", "c"] and "b" not in s and len(s) == 2
    s.put("a", None)  # null is a value: the key stays
    assert "a" in s and s.get("a", 5) is None


def test_values_are_the_states_own():
    s = KeyValueState()
    value = {"list": [1, 2]}
    s.put("k", value)
    value["list"].append(3)  # the caller's object, not the state's
    got = s.get("k")
    assert got == {"list": [1, 2]}
    got["list"].append(4)  # a copy too
    assert s.get("k") == {"list": [1, 2]}
    assert s.items()[0][1] == {"list": [1, 2]}
    s.put("t", (1, "a"))  # a tuple is stored as the array it would be on the wire
    assert s.get("t") == [1, "a"]


@pytest.mark.parametrize("key", [1, None, b"k", ("k",), 1.5])
def test_keys_must_be_strings(key):
    s = KeyValueState()
    with pytest.raises(TypeError, match=repr(key).replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        s.put(key, 1)
    with pytest.raises(TypeError):
        s.delete(key)
    assert len(s) == 0


@pytest.mark.parametrize(
    "value,why",
    [
        (math.nan, "not a JSON number"),
        (math.inf, "not a JSON number"),
        ([1, -math.inf], "not a JSON number"),
        (b"bytes", "bytes is not a JSON value"),
        ({1, 2}, "set is not a JSON value"),
        ({1: "x"}, "object key 1 is not a string"),
        ({"a": {"b": object()}}, "object is not a JSON value"),
        (2**64, "beyond 64 bits"),
        (-(2**63) - 1, "beyond 64 bits"),
    ],
)
def test_values_must_be_json_values_named_by_key(value, why):
    s = KeyValueState()
    s.put("k", "before")
    s._prepare()
    with pytest.raises(ValueError, match=why) as info:
        s.put("k", value)
    assert "'k'" in str(info.value)
    # refused: nothing changed, nothing dirty
    assert s.get("k") == "before"
    assert prepared(s) == ({}, [])


def test_integers_at_the_64_bit_edges_are_values():
    s = KeyValueState()
    s.put("min", -(2**63))
    s.put("max", 2**64 - 1)
    s.put("f", 1.5)
    s.put("t", True)
    assert s.get("max") == 2**64 - 1 and s.get("t") is True


# -- prepare: the changes since the last init / prepared / rollback --------------


def test_prepare_carries_the_changed_keys_only_then_nothing():
    s = KeyValueState()
    s._init({"a": 1, "b": 2, "c": 3})
    assert prepared(s) == ({}, [])
    s.put("a", 10)
    s.delete("b")
    s.put("new", [1])
    assert prepared(s) == ({"a": 10, "new": [1]}, ["b"])
    assert prepared(s) == ({}, [])  # nothing changed since
    s.put("c", 4)
    assert prepared(s) == ({"c": 4}, [])


def test_a_key_is_in_put_or_delete_by_its_last_change():
    s = KeyValueState()
    s._init({"a": 1})
    s.delete("a")
    s.put("a", 2)  # deleted, then set again: put
    s.put("b", 1)
    s.delete("b")  # set, then deleted: delete (§9.7: "each key deleted since")
    assert prepared(s) == ({"a": 2}, ["b"])


def test_init_replaces_the_state_and_forgets_changes():
    s = KeyValueState()
    s.put("old", 1)
    s._init({"x": "y"})
    assert snapshot(s) == {"x": "y"}
    assert prepared(s) == ({}, [])
    s._rollback()
    assert snapshot(s) == {"x": "y"}


# -- commit and rollback ----------------------------------------------------------


def test_rollback_before_any_commit_restores_the_init_state():
    s = KeyValueState()
    s._init({"a": 1, "b": 2})
    s.put("a", 5)
    s.delete("b")
    s.put("c", 3)
    s._prepare()
    s.put("a", 6)
    s._rollback()
    assert snapshot(s) == {"a": 1, "b": 2}
    assert prepared(s) == ({}, [])  # nothing dirty after a rollback


def test_rollback_restores_the_last_commit():
    s = KeyValueState()
    s._init({})
    s.put("a", 1)
    s.put("b", 1)
    s._prepare()
    s._commit()
    s.put("a", 2)
    s.delete("b")
    s.put("c", 1)
    s._prepare()  # prepared, never committed
    s.put("a", 3)
    s._rollback()
    assert snapshot(s) == {"a": 1, "b": 1}
    s.put("d", 1)
    assert prepared(s) == ({"d": 1}, [])


def test_commit_keeps_what_changed_after_its_prepare_undoable():
    s = KeyValueState()
    s._init({"a": 1})
    s.put("a", 2)
    s._prepare()  # prepared N: a=2
    s.put("a", 3)  # (a tick between prepared N and commit N)
    s.put("z", 1)
    s._commit()  # a=2 is committed; a=3 and z are not
    s._rollback()
    assert snapshot(s) == {"a": 2}


def test_commit_of_a_later_prepare_covers_the_earlier_ones():
    s = KeyValueState()
    s._init({})
    s.put("a", 1)
    s._prepare()
    s.put("b", 1)
    s._prepare()
    s._commit()  # commit of the second prepare: both are durable
    s._rollback()
    assert snapshot(s) == {"a": 1, "b": 1}


def test_rollback_restores_values_not_copies_changed_in_place():
    s = KeyValueState()
    s._init({"l": [1]})
    v = s.get("l")
    v.append(2)
    s.put("l", v)
    s._rollback()
    assert s.get("l") == [1]


# -- chunks --------------------------------------------------------------------------


def test_more_than_chunk_keys_are_split():
    s = KeyValueState()
    s._init({f"d{i}": i for i in range(10)})
    for i in range(CHUNK_KEYS * 2 + 5):
        s.put(f"k{i}", i)
    for i in range(10):
        s.delete(f"d{i}")
    chunks = s._prepare()
    assert len(chunks) == 3
    assert all(len(p) + len(d) <= CHUNK_KEYS for p, d in chunks)
    put = {k: v for p, _ in chunks for k, v in p.items()}
    delete = [k for _, d in chunks for k in d]
    assert put == {f"k{i}": i for i in range(CHUNK_KEYS * 2 + 5)}
    assert sorted(delete) == sorted(f"d{i}" for i in range(10))
    assert s._prepare() == [({}, [])]


def test_big_values_are_split_by_bytes_and_never_cut():
    s = KeyValueState()
    big = "x" * (CHUNK_BYTES // 3)
    for i in range(7):
        s.put(f"k{i}", big)
    s.put("huge", "y" * (CHUNK_BYTES * 2))  # bigger than a chunk: a chunk of its own
    chunks = s._prepare()
    for put, delete in chunks:
        size = len(json.dumps(put))
        assert size <= CHUNK_BYTES + 100 or len(put) == 1, (size, list(put))
    assert sorted(k for p, _ in chunks for k in p) == sorted([f"k{i}" for i in range(7)] + ["huge"])
    assert len(chunks) >= 4


def test_chunk_limits_are_parameters():
    s = KeyValueState()
    for i in range(5):
        s.put(str(i), i)
    chunks = s._prepare(max_keys=2)
    assert [len(p) for p, _ in chunks] == [2, 2, 1]


# -- a model: the state as a plain dict, checkpoints as copies -------------------------


ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from("abcde"), st.integers(0, 9)),
        st.tuples(st.just("delete"), st.sampled_from("abcde")),
        st.tuples(st.just("prepare")),
        st.tuples(st.just("commit")),
        st.tuples(st.just("rollback")),
    ),
    max_size=40,
)


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from("abcde"), st.integers(0, 9)), ops)
def test_against_a_model(init, steps):
    """What the host would store: applying each prepared's changes to the
    committed state gives, at each commit, the state as of that prepare; a
    rollback gives back the last committed state."""
    s = KeyValueState()
    s._init(dict(init))
    committed = dict(init)  # the host's store
    host_view = dict(init)  # committed + the prepared changes not yet committed
    as_of_prepare = None
    for op in steps:
        if op[0] == "put":
            s.put(op[1], op[2])
        elif op[0] == "delete":
            s.delete(op[1])
        elif op[0] == "prepare":
            (put, delete), = s._prepare()
            assert not put.keys() & set(delete)
            host_view.update(put)
            for k in delete:
                host_view.pop(k, None)
            assert host_view == snapshot(s)  # the prepared changes bring the host up to date
            as_of_prepare = dict(host_view)
        elif op[0] == "commit" and as_of_prepare is not None:  # (the core allows a commit only then)
            s._commit()
            committed = as_of_prepare
            as_of_prepare = None
        elif op[0] == "rollback":
            s._rollback()
            assert snapshot(s) == committed
            host_view = dict(committed)
            as_of_prepare = None
