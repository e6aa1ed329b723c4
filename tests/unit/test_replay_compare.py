"""The comparison rules of ``multilang replay`` (docs/OBSERVE.md "Record and replay"), without processes."""

from __future__ import annotations

from multilang.connection import Role
from multilang.messages import Ack, Batch, Emit, Fail, Handshake, Pid, Sync, Tuple
from multilang.shellbolt._replay.replay import Plan, _compare, _Tally

A = Tuple(id="a", component="src", stream="default", task=1, values=["x y"])
B = Tuple(id="b", component="src", stream="default", task=1, values=["z"])


def _plan(recorded: list, role: Role = Role.BOLT) -> Plan:
    rec = _Tally(role is Role.SPOUT)
    for ev in recorded:
        rec.add(ev)
    return Plan(role=role, handshake=Handshake(pid_dir="/p", conf={}, context={}), pid=Pid(pid=1), steps=[],
                task_ids=[], recorded=rec, inputs={"a": A, "b": B}, commands=["activate", "next", "next"])


def _live(events: list, spout: bool = False) -> _Tally:
    t = _Tally(spout)
    for ev in events:
        t.add(ev)
    return t


RECORDED = [Emit(values=["x"], anchors=("a",)), Emit(values=["y"], anchors=("a",)), Ack(id="a"),
            Emit(values=["z"], anchors=("b",)), Ack(id="b")]


def test_the_same_events_in_a_batch_and_across_tuples_in_another_order_are_no_difference():
    p = _plan(RECORDED)
    assert _compare(p, _live(RECORDED)) is None
    batched = [Batch(emits=[[["z"], ["b"], "default"], [["x"], ["a"], "default"]], acks=["b"]),
               Batch(emits=[[["y"], "a", "default"]], acks=["a"])]
    assert _compare(p, _live(batched)) is None


def test_order_within_a_tuple_values_and_ack_or_fail_are_differences():
    p = _plan(RECORDED)
    swapped = [Emit(values=["y"], anchors=("a",)), Emit(values=["x"], anchors=("a",)), Ack(id="a"), *RECORDED[3:]]
    diff = _compare(p, _live(swapped))
    assert diff.startswith("first difference: tuple a from src:1 stream 'default' values [\"x y\"]")
    assert 'expected emit ["x"] anchored to a' in diff and 'got      emit ["y"] anchored to a' in diff
    failed = [*RECORDED[:2], Fail(id="a"), *RECORDED[3:]]
    assert "its output event 3: expected ack" in _compare(p, _live(failed))
    assert "got      fail" in _compare(p, _live(failed))
    # JSON values, not Python's ==: true is not 1
    p1 = _plan([Emit(values=[1], anchors=("a",)), Ack(id="a")])
    assert _compare(p1, _live([Emit(values=[True], anchors=("a",)), Ack(id="a")])) is not None
    assert _compare(p1, _live([Emit(values=[1], anchors=("a",)), Ack(id="a")])) is None


def test_a_tuple_the_recording_never_settled_need_only_start_alike():
    p = _plan([Emit(values=["x"], anchors=("a",))])  # the session ended before tuple a was acked
    assert _compare(p, _live([Emit(values=["x"], anchors=("a",)), Emit(values=["y"], anchors=("a",)),
                              Ack(id="a")])) is None
    assert _compare(p, _live([Emit(values=["q"], anchors=("a",))])) is not None
    # a settled one must match exactly: one emit more is a difference
    p = _plan(RECORDED)
    more = [*RECORDED, Emit(values=["w"], anchors=("b",))]
    assert "expected nothing more" in _compare(p, _live(more))


def test_unanchored_emits_are_one_sequence_and_spout_emits_belong_to_their_command():
    p = _plan([Emit(values=["u1"]), Emit(values=["u2"]), Ack(id="a")])
    assert _compare(p, _live([Ack(id="a"), Emit(values=["u1"]), Emit(values=["u2"])])) is None
    assert "the unanchored emits" in _compare(p, _live([Emit(values=["u2"]), Emit(values=["u1"]), Ack(id="a")]))
    spout = [Sync(), Emit(values=["s"], id=7, need_task_ids=False), Sync(), Sync()]
    p = _plan(spout, Role.SPOUT)
    assert _compare(p, _live(spout, spout=True)) is None
    later = [Sync(), Sync(), Emit(values=["s"], id=7), Sync()]  # the emit answers the second next, not the first
    assert _compare(p, _live(later, spout=True)).startswith("first difference: command 2 (next)")
