"""What crosses between host workers (shellbolt/_workers/wire.py): the
deliveries for one task, packed by column as producers route them, framed,
cut anywhere by the socket, and unpacked on the other side, are the same
deliveries in the same order: values, source, stream, source task, tick, and
the token (a one-hop root id, or ids per root with a fresh ack value)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from multilang.shellbolt._model.acker import TupleEdges
from multilang.shellbolt._runtime.tasks import Delivery
from multilang.shellbolt._workers.wire import Frames, encode, pack, unpack

_TOKEN = st.one_of(st.integers(1, 2**64 - 1),
                   st.dictionaries(st.integers(1, 2**64 - 1), st.integers(0, 2**64 - 1), max_size=3).map(TupleEdges))
_DELIVERY = st.builds(Delivery, st.lists(st.one_of(st.text(max_size=5), st.integers()), max_size=3),
                      st.sampled_from(["split", "count", None]), st.sampled_from(["default", "s2"]),
                      st.integers(0, 3), _TOKEN, st.booleans())


@given(puts=st.lists(st.lists(_DELIVERY, min_size=1, max_size=6), max_size=8), cut=st.integers(0, 1 << 16))
def test_packed_deliveries_cross_as_they_were_routed(puts, cut):
    runs: list = []
    for ds in puts:  # one put per producer's routing, as Link.put does
        pack(runs, ds)
    data = encode((0, {7: runs}))
    frames = Frames()
    got = frames.feed(data[:cut]) + frames.feed(data[cut:])
    assert len(got) == 1
    sent = [d for ds in puts for d in ds]
    back = unpack(got[0][1][7])
    assert [d[:4] + (d.tick,) for d in back] == [d[:4] + (d.tick,) for d in sent]
    for b, d in zip(back, sent):
        if type(d.edges) is int:
            assert b.edges == d.edges
        else:  # its ids per root; its ack value starts afresh where it is processed
            assert type(b.edges) is TupleEdges and b.edges.ids == d.edges.ids and b.edges.ack_val == 0


def test_an_emit_is_refused_at_a_worker_only_when_its_values_do_not_pickle():
    """cannot_cross: plain values pass without a pickle; any other value is
    pickled to find out, wherever it stands among plain ones."""
    import threading

    from multilang.shellbolt._runtime.tasks import cannot_cross

    class Local:  # (made inside a function: pickle cannot find it by name)
        pass

    for ok in [[], ["word", 3, 2.5, True, None, b"x"], [("a", 1), {"k": [1]}], [bytearray(b"x")]]:
        assert cannot_cross(ok) is None, ok
    for bad in [[threading.Lock()], ["word", Local()], [1, [lambda: 0]]]:
        why = cannot_cross(bad)
        assert why is not None and why.startswith("its values do not pickle"), (bad, why)
