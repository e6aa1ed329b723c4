"""The pure acker (shellbolt/_model/acker.py, spec/PROTOCOL.md §7). Time is passed in.

The Hypothesis test builds random tuple trees the way a topology does (spout
roots fanned out to several tasks, bolt emits anchored to one or more live
tuples, possibly of the same tree, fanned out again, unanchored emits mixed
in) and acks every tuple in a random order. A spout tuple sent to one task
gets, at random, a one-hop token (``spout_emits``/``spout_root``: a bare int,
made a TupleEdges only when an emit is anchored to it, as a task does) or
TupleEdges (``spout_emit``), and is acked by ``ack`` or ``ack_many``: the two
kinds of token must make the same trees. A model that only knows which
tuples are still unacked says exactly when each tree must complete: at the
ack of its last live tuple, not one ack earlier.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multilang.shellbolt import Acker
from multilang.shellbolt._model.acker import TupleEdges, edges_of, new_edge_id, roots_of

T0 = 1000.0  # an arbitrary "now"; the acker never reads a clock


def make_acker(timeout: float = 30.0, seed: int = 0) -> Acker:
    return Acker(timeout, rand=random.Random(seed).getrandbits)


def drained_ids(acker: Acker) -> tuple[list, list]:
    acked, failed = acker.drain()
    return [m for _, m in acked], [m for _, m in failed]


# --- random trees ----------------------------------------------------------------


class _Live:
    """Model of one delivered tuple: its acker edges and the roots it belongs to."""

    def __init__(self, edges: int | TupleEdges, roots: frozenset) -> None:
        self.edges = edges
        self.roots = roots


@settings(max_examples=200, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_random_tree_completes_exactly_at_its_last_ack(data, seed):
    acker = make_acker(seed=seed)
    live: list[_Live] = []
    n_roots = data.draw(st.integers(1, 3), label="roots")
    expected_done: set = set()
    for msg_id in range(n_roots):
        fan_out = data.draw(st.integers(0, 3), label="spout fan-out")
        how = data.draw(st.sampled_from(["edges", "root", "burst"]) if fan_out == 1 else st.just("edges"),
                        label="token kind")
        if how == "root":
            edges = [acker.spout_root(7, msg_id, T0)]
        elif how == "burst":
            edges = acker.spout_emits(7, [msg_id], T0)
        else:
            _, edges = acker.spout_emit(7, msg_id, fan_out, T0)
        assert all(list(roots_of(e)) for e in edges)
        live.extend(_Live(e, frozenset([msg_id])) for e in edges)
        if fan_out == 0:
            expected_done.add(msg_id)  # §7.1: a reliable emit to no task completes at once
    acked, failed = drained_ids(acker)
    assert sorted(acked) == sorted(expected_done) and failed == []
    done = set(expected_done)

    def roots_alive() -> set:
        return {r for t in live for r in t.roots}

    steps = data.draw(st.integers(0, 25), label="steps")
    for _ in range(steps):
        if not live:
            break
        if data.draw(st.booleans(), label="emit?"):
            # A bolt emit anchored to 0..3 live tuples (maybe of the same tree),
            # to 0..3 tasks. Anchoring needs live (pending) anchors (§3.6).
            k = data.draw(st.integers(0, min(3, len(live))), label="n anchors")
            idx = data.draw(st.lists(st.integers(0, len(live) - 1), min_size=k, max_size=k, unique=True),
                            label="anchors")
            anchors = [live[i] for i in idx]
            fan_out = data.draw(st.integers(0, 3), label="bolt fan-out")
            for a in anchors:  # as Task.edges does: the token becomes TupleEdges for good
                a.edges = edges_of(a.edges)
            new = acker.anchor([a.edges for a in anchors], fan_out)
            assert len(new) == fan_out
            roots = frozenset().union(*(a.roots for a in anchors)) if anchors else frozenset()
            live.extend(_Live(e, roots) for e in new)
            acked, failed = drained_ids(acker)
            assert acked == [] and failed == [], "an emit never completes or fails a tree"
        else:
            i = data.draw(st.integers(0, len(live) - 1), label="ack one")
            t = live.pop(i)
            if data.draw(st.booleans(), label="ack_many?"):
                acker.ack_many([t.edges])
            else:
                acker.ack(t.edges)
            now_done = {r for r in t.roots if r not in roots_alive()}
            acked, failed = drained_ids(acker)
            assert failed == []
            assert sorted(acked) == sorted(now_done), "a tree completes at its last ack, not before or after"
            done |= now_done
    # Ack the rest in a random order.
    order = data.draw(st.permutations(range(len(live))), label="ack order")
    rest = [live[i] for i in order]
    live = rest[:]
    for t in rest:
        live.remove(t)
        acker.ack(t.edges)
        now_done = {r for r in t.roots if r not in roots_alive()}
        acked, failed = drained_ids(acker)
        assert failed == []
        assert sorted(acked) == sorted(now_done), "a tree completes at its last ack, not before or after"
        done |= now_done
    assert done == set(range(n_roots))
    assert acker.pending == 0
    assert acker.stats["completed"] == n_roots and acker.stats["failed"] == 0


# --- hand-written trees -------------------------------------------------------------


def test_linear_chain_completes_only_at_the_last_ack():
    acker = make_acker()
    _, (s,) = acker.spout_emit(1, "m", 1, T0)
    (a,) = acker.anchor([s], 1)
    acker.ack(s)
    assert acker.drain() == ([], [])
    (b,) = acker.anchor([a], 1)
    acker.ack(a)
    assert acker.drain() == ([], [])
    acker.ack(b)
    assert acker.drain() == ([(1, "m")], [])
    assert acker.pending == 0


def test_ack_order_does_not_matter_children_before_parent():
    acker = make_acker()
    _, (s,) = acker.spout_emit(1, "m", 1, T0)
    kids = acker.anchor([s], 3)
    for k in kids:
        acker.ack(k)
    assert acker.drain() == ([], [])
    acker.ack(s)
    assert acker.drain() == ([(1, "m")], [])


def test_multi_anchoring_to_two_roots_needs_the_shared_tuple_acked():
    acker = make_acker()
    _, (a,) = acker.spout_emit(1, "r1", 1, T0)
    _, (b,) = acker.spout_emit(2, "r2", 1, T0)
    (n,) = acker.anchor([a, b], 1)
    assert set(n.ids) == set(a.ids) | set(b.ids)
    acker.ack(a)
    acker.ack(b)
    assert acker.drain() == ([], []), "both trees still wait for the multi-anchored tuple"
    acker.ack(n)
    acked, failed = acker.drain()
    assert sorted(acked) == [(1, "r1"), (2, "r2")] and failed == []


def test_multi_anchoring_to_two_tuples_of_the_same_root():
    """§7.2: each anchor gets its own edge id, so a tuple anchored to two
    tuples of one tree still holds that tree open."""
    acker = make_acker()
    _, (x, y) = acker.spout_emit(1, "m", 2, T0)
    (n,) = acker.anchor([x, y], 1)
    acker.ack(x)
    acker.ack(y)
    assert acker.drain() == ([], []), "the tree completed although the multi-anchored tuple is unacked"
    acker.ack(n)
    assert acker.drain() == ([(1, "m")], [])


def test_multi_anchoring_fan_out_and_same_root_mixed():
    acker = make_acker()
    _, (x, y) = acker.spout_emit(1, "m", 2, T0)
    _, (z,) = acker.spout_emit(1, "k", 1, T0)
    outs = acker.anchor([x, y, z], 2)
    for t in (x, y, z):
        acker.ack(t)
    assert acker.drain() == ([], [])
    acker.ack(outs[0])
    assert acker.drain() == ([], [])
    acker.ack(outs[1])
    acked, _ = acker.drain()
    assert sorted(acked, key=repr) == sorted([(1, "m"), (1, "k")], key=repr)


# --- fail --------------------------------------------------------------------------


def test_fail_anywhere_fails_the_root_once_and_later_acks_and_fails_are_ignored():
    acker = make_acker()
    _, (s1, s2) = acker.spout_emit(3, "m", 2, T0)
    (a,) = acker.anchor([s1], 1)
    (deep,) = acker.anchor([a], 1)
    acker.ack(s1)
    acker.ack(a)
    acker.fail(deep)  # a leaf two levels down
    assert acker.drain() == ([], [(3, "m")])
    # Everything afterwards is ignored: the rest of the tree, a second fail.
    acker.ack(s2)
    acker.fail(s2)
    acker.ack(deep)
    acker.fail(deep)
    assert acker.drain() == ([], [])
    assert acker.pending == 0
    assert acker.stats["failed"] == 1 and acker.stats["completed"] == 0


def test_fail_of_multi_anchored_tuple_fails_every_root_once():
    acker = make_acker()
    _, (a,) = acker.spout_emit(1, "r1", 1, T0)
    _, (b,) = acker.spout_emit(2, "r2", 1, T0)
    (n,) = acker.anchor([a, b], 1)
    acker.fail(n)
    acked, failed = acker.drain()
    assert acked == [] and sorted(failed) == [(1, "r1"), (2, "r2")]
    acker.ack(a)
    acker.ack(b)
    acker.ack(n)
    assert acker.drain() == ([], [])


def test_fail_does_not_touch_other_trees():
    acker = make_acker()
    _, (a,) = acker.spout_emit(1, "bad", 1, T0)
    _, (b,) = acker.spout_emit(1, "good", 1, T0)
    acker.fail(a)
    acker.ack(b)
    assert acker.drain() == ([(1, "good")], [(1, "bad")])


# --- timeouts ----------------------------------------------------------------------


def test_expire_fails_a_tree_at_its_timeout_not_before():
    acker = make_acker(timeout=30.0)
    _, (s,) = acker.spout_emit(1, "m", 1, T0)
    assert acker.expire(T0 + 29.999) == 0
    assert acker.drain() == ([], [])
    assert acker.expire(T0 + 30.0) == 1
    assert acker.drain() == ([], [(1, "m")])
    assert acker.stats["timed_out"] == 1 and acker.stats["failed"] == 1
    assert acker.expire(T0 + 100) == 0, "a tree times out once"


def test_late_ack_after_timeout_is_ignored():
    acker = make_acker(timeout=2.0)
    _, (s,) = acker.spout_emit(1, "m", 1, T0)
    (a,) = acker.anchor([s], 1)
    acker.ack(s)
    acker.expire(T0 + 5)
    assert acker.drain() == ([], [(1, "m")])
    acker.ack(a)  # would have completed it
    assert acker.drain() == ([], [])
    assert acker.stats["completed"] == 0


def test_expire_only_fails_trees_past_their_own_deadline():
    acker = make_acker(timeout=10.0)
    acker.spout_emit(1, "old", 1, T0)
    _, (young,) = acker.spout_emit(1, "young", 1, T0 + 5)
    assert acker.expire(T0 + 12) == 1
    assert acker.drain() == ([], [(1, "old")])
    acker.ack(young)
    assert acker.drain() == ([(1, "young")], [])


def test_completed_tree_does_not_time_out():
    acker = make_acker(timeout=1.0)
    _, (s,) = acker.spout_emit(1, "m", 1, T0)
    acker.ack(s)
    assert acker.drain() == ([(1, "m")], [])
    assert acker.expire(T0 + 50) == 0
    assert acker.drain() == ([], [])


# --- untracked tuples ------------------------------------------------------------


def test_unanchored_tuples_are_not_tracked():
    acker = make_acker()
    free = acker.anchor([], 3)
    assert [t.ids for t in free] == [{}, {}, {}]
    # Anchoring to an unanchored tuple stays untracked too.
    (child,) = acker.anchor([free[0]], 1)
    assert child.ids == {}
    for t in free + [child]:
        acker.ack(t)
    acker.fail(free[1])
    assert acker.pending == 0
    assert acker.drain() == ([], [])


def test_unanchored_emit_does_not_hold_a_tree_open():
    acker = make_acker()
    _, (s,) = acker.spout_emit(1, "m", 1, T0)
    acker.anchor([], 2)  # the bolt also emits unanchored
    acker.ack(s)
    assert acker.drain() == ([(1, "m")], [])


def test_anchored_to_mix_of_tracked_and_untracked():
    acker = make_acker()
    _, (s,) = acker.spout_emit(1, "m", 1, T0)
    (free,) = acker.anchor([], 1)
    (n,) = acker.anchor([s, free], 1)
    assert set(n.ids) == set(s.ids)
    acker.ack(s)
    acker.ack(free)
    assert acker.drain() == ([], [])
    acker.ack(n)
    assert acker.drain() == ([(1, "m")], [])


# --- spout emits -------------------------------------------------------------------


def test_spout_emit_to_zero_targets_completes_at_once():
    acker = make_acker()
    root, edges = acker.spout_emit(4, "nowhere", 0, T0)
    assert edges == []
    assert acker.drain() == ([(4, "nowhere")], [])
    assert acker.pending == 0
    assert acker.expire(T0 + 1e6) == 0


def test_spout_emit_registers_one_root_with_one_edge_per_target():
    acker = make_acker()
    root, edges = acker.spout_emit(4, "m", 3, T0)
    assert len(edges) == 3
    assert all(set(e.ids) == {root} for e in edges)
    assert all(e.ids[root] != 0 for e in edges)
    assert acker.pending == 1 and acker.pending_for(4) == 1 and acker.pending_for(5) == 0
    for e in edges[:-1]:
        acker.ack(e)
        assert acker.drain() == ([], [])
    acker.ack(edges[-1])
    assert acker.drain() == ([(4, "m")], [])


def test_init_with_value_zero_completes_at_once():
    acker = make_acker()
    acker.init(12345, 0, 2, "m", T0)
    assert acker.drain() == ([(2, "m")], [])


def test_ack_may_arrive_before_registration():
    """§7.1: registration and acks may arrive in any order (XOR commutes);
    a root is never complete before it is registered."""
    acker = make_acker()
    root, e = 0xABCDEF, 0x1234
    acker.ack(TupleEdges({root: e}))
    assert acker.drain() == ([], []), "not complete before it is registered"
    acker.init(root, e, 1, "m", T0)
    assert acker.drain() == ([(1, "m")], [])


@pytest.mark.parametrize(
    "msg_id",
    [0, 1, -2, "1", "-3", "", 4.5, 1.0, True, None, {"k": [5]}, [1, "a"], 2**63 - 1],
    ids=repr,
)
def test_drain_preserves_msg_id_and_its_json_type(msg_id):
    acker = make_acker()
    _, (s,) = acker.spout_emit(9, msg_id, 1, T0)
    acker.ack(s)
    acked, failed = acker.drain()
    assert acked == [(9, msg_id)] and failed == []
    assert type(acked[0][1]) is type(msg_id)
    _, (f,) = acker.spout_emit(9, msg_id, 1, T0)
    acker.fail(f)
    acked, failed = acker.drain()
    assert failed == [(9, msg_id)] and type(failed[0][1]) is type(msg_id)


def test_drain_reports_each_result_once_and_in_order():
    acker = make_acker()
    edges = {}
    for m in ("a", "b", "c"):
        _, (edges[m],) = acker.spout_emit(1, m, 1, T0)
    acker.ack(edges["b"])
    acker.fail(edges["c"])
    acker.ack(edges["a"])
    assert acker.drain() == ([(1, "b"), (1, "a")], [(1, "c")])
    assert acker.drain() == ([], [])


def test_same_msg_id_twice_is_two_trees():
    """A replay reuses the message id; the two trees are independent."""
    acker = make_acker()
    _, (first,) = acker.spout_emit(1, "m", 1, T0)
    _, (second,) = acker.spout_emit(1, "m", 1, T0)
    assert acker.pending == 2
    acker.fail(first)
    acker.ack(second)
    assert acker.drain() == ([(1, "m")], [(1, "m")])


def test_new_edge_id_is_nonzero_64_bit():
    calls = iter([0, 0, 5])
    assert new_edge_id(lambda bits: next(calls)) == 5
    rnd = random.Random(1)
    for _ in range(1000):
        e = new_edge_id(rnd.getrandbits)
        assert 0 < e < 2**64


def test_is_live_until_every_root_of_the_tuple_is_finished():
    acker = make_acker()
    _, (a,) = acker.spout_emit(1, "r1", 1, T0)
    _, (b,) = acker.spout_emit(2, "r2", 1, T0)
    (n,) = acker.anchor([a, b], 1)
    assert acker.is_live(a) and acker.is_live(n)
    acker.fail(a, "boom")
    assert not acker.is_live(a), "its only tree failed"
    assert acker.is_live(n), "still part of r2"
    acker.expire(T0 + 31)
    assert not acker.is_live(n) and not acker.is_live(b)
    assert acker.is_live(TupleEdges()), "an unanchored tuple (or a tick) is always live"


def test_a_failure_carries_its_cause_to_the_spout():
    acker = make_acker(timeout=10)
    _, (a,) = acker.spout_emit(1, "r1", 1, T0)
    acker.spout_emit(1, "r2", 1, T0)
    acker.fail(a, "failed by bolt:3 (pid 9): ValueError: x")
    acker.expire(T0 + 10)
    acked, failed, causes = acker.drain_with_causes()
    assert acked == [] and failed == [(1, "r1"), (1, "r2")]
    assert causes == ["failed by bolt:3 (pid 9): ValueError: x",
                      "timed out: not completed within 10s (topology.message.timeout.secs)"]
    assert acker.drain_with_causes() == ([], [], [])
