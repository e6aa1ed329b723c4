"""The XOR acker partitioned by worker (shellbolt/_model/acker.py, issue 35):
each worker's acker owns the roots its spouts register; the acks and fails
of other workers' roots travel to their owner in batches, in any order. A
tree completes at its owner exactly when its last tuple is acked, wherever
its tuples were processed; a failure anywhere fails it once, at its owner.

Hypothesis builds random trees over 1 to 4 workers: spout roots fanned out,
bolt emits anchored to live tuples of the tree, each tuple processed on a
random worker, and the messages between ackers delivered in random batches
at random moments. A model that only knows which tuples are unacked says
when each tree must complete."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from multilang.shellbolt import Acker
from multilang.shellbolt._model.acker import TupleEdges, edges_of

T0 = 1000.0


def _ackers(n: int, seed: int) -> list[Acker]:
    rng = random.Random(seed)
    return [Acker(30.0, rand=rng.getrandbits, worker=w, workers=n) for w in range(n)]


def test_a_worker_draws_only_roots_it_owns_and_one_worker_is_the_plain_acker():
    ackers = _ackers(3, 1)
    for w, a in enumerate(ackers):
        roots = [a.spout_root(1, i, T0) for i in range(200)] + a.spout_emits(1, list(range(200, 400)), T0)
        roots += [a.spout_emit(1, i, 3, T0)[0] for i in range(400, 600)]
        assert all(r % 3 == w and 0 < r < 1 << 64 for r in roots)
        assert a.pending == 600
    single = Acker(30.0, rand=random.Random(5).getrandbits)
    plain = Acker(30.0, rand=random.Random(5).getrandbits)
    assert [single.spout_root(1, i, T0) for i in range(50)] == [plain.new_id() for _ in range(50)]


def test_an_ack_of_another_workers_root_goes_to_its_owner_and_completes_the_tree_there():
    a, b = _ackers(2, 2)
    root = a.spout_root(1, "m", T0)  # worker 0's tree, its one tuple processed on worker 1
    assert b.is_live(root)  # not b's to say
    b.ack(root)
    assert b.pending == 0 and b.drain() == ([], [])
    sent = b.take_remote()
    assert list(sent) == [0] and b.take_remote() == {}
    a.apply_remote(*sent[0])
    assert a.drain() == ([(1, "m")], [])


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 4), seed=st.integers(0, 2**32), epochs=st.lists(st.integers(0, 600), min_size=2, max_size=4))
def test_another_workers_tree_is_live_while_its_epoch_is_the_runs(n, seed, epochs):
    # A tuple of another worker's tree is live (its owner decides) while the run's rollback epoch is the
    # one its root was drawn in; after a rollback (a new epoch) it is not: every such tree was failed.
    # Epochs are told apart modulo 256 (one 256 rollbacks old would pass for live).
    ackers = _ackers(n, seed)
    drawn = []  # (root, owner, epoch it was drawn in)
    for e in epochs:
        for w, a in enumerate(ackers):
            a.epoch = e
            drawn += [(a.new_root(), w, e) for _ in range(5)]
    for w, a in enumerate(ackers):
        for e in epochs:
            a.epoch = e
            for r, owner, drawn_in in drawn:
                want = owner != w and drawn_in % 256 == e % 256
                assert a.is_live(r) is want and a.is_live(edges_of(r)) is want, (w, e, owner, drawn_in)
                mixed = edges_of(r)
                mixed.ids[ackers[w].new_root()] = 1  # with a root of this worker's, not registered: as alone
                assert a.is_live(mixed) is want
    registered = ackers[0].spout_root(1, "m", T0)
    assert ackers[0].is_live(registered) and ackers[0].is_live(edges_of(registered))
    assert ackers[0].is_live(TupleEdges())  # unanchored: always live


def test_a_fail_of_another_workers_root_fails_it_once_at_its_owner_with_its_cause():
    a, b = _ackers(2, 3)
    root, (edge, edge2) = a.spout_emit(7, "m", 2, T0)
    b.fail(edge, "bolt x failed it")
    b.fail(edge2, "again")
    a.apply_remote(*b.take_remote()[0])
    acked, failed, causes = a.drain_with_causes()
    assert (acked, failed, causes) == ([], [(7, "m")], ["bolt x failed it"])
    a.apply_remote({root: 12345}, [(root, "late")])  # after the failure: ignored, as on one acker
    assert a.drain() == ([], []) and a.pending == 0


def test_a_tree_failed_then_acked_in_one_batch_to_its_owner_fails_there_as_on_one_acker():
    """A bolt on worker 1 emits anchored to its input and the host refuses
    the emit (wrong arity, say): the input's tree is failed; then the bolt
    acks the input. Both reach the owner in one batch, the acks folded and
    the fail listed: the tree fails (its spout replays it), as on one
    acker. A trial's run on 2 workers completed it: the input was lost."""
    a, b = _ackers(2, 4)
    root, (edge,) = a.spout_emit(7, "m", 1, T0)
    one = Acker(30.0, rand=random.Random(4).getrandbits)
    one_root, (one_edge,) = one.spout_emit(7, "m", 1, T0)
    for acker, t in ((b, edge), (one, one_edge)):
        acker.fail(t, "emitted 2 values on stream 'default', which declares 1 fields")
        acker.ack(t)
    a.apply_remote(*b.take_remote()[0])
    assert a.drain() == one.drain() == ([], [(7, "m")])
    assert a.pending == one.pending == 0


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_trees_over_workers_complete_at_their_owner_exactly_at_their_last_ack(data):
    n = data.draw(st.integers(1, 4), label="workers")
    ackers = _ackers(n, data.draw(st.integers(0, 2**32), label="seed"))
    rng = random.Random(data.draw(st.integers(0, 2**32), label="order"))
    live: dict[int, list[tuple[object, int]]] = {}  # tree -> its unacked tuples (token, the worker holding it)
    owner_of: dict[int, int] = {}
    done: set[int] = set()
    in_transit: list[tuple[int, tuple[dict, list]]] = []  # (to, ({root: xor}, fails))

    def post() -> None:
        for a in ackers:
            for to, msgs in a.take_remote().items():
                in_transit.append((to, msgs))

    def deliver(k: int) -> None:
        rng.shuffle(in_transit)
        for _ in range(min(k, len(in_transit))):
            to, msgs = in_transit.pop()
            ackers[to].apply_remote(*msgs)

    def check_completions() -> None:
        for w, a in enumerate(ackers):
            acked, failed = a.drain()
            assert failed == []
            for _task, tree in acked:
                assert owner_of[tree] == w
                assert not live[tree], f"tree {tree} completed with {len(live[tree])} tuple(s) unacked"
                assert tree not in done
                done.add(tree)

    n_trees = data.draw(st.integers(1, 6), label="trees")
    for tree in range(n_trees):
        w = rng.randrange(n)
        owner_of[tree] = w
        fan = rng.randint(1, 3)
        if fan == 1:
            tokens = [ackers[w].spout_root(1, tree, T0)]
        else:
            tokens = list(ackers[w].spout_emit(1, tree, fan, T0)[1])
        live[tree] = [(t, rng.randrange(n)) for t in tokens]
    steps = 0
    while any(live.values()) and steps < 200:
        steps += 1
        tree = rng.choice([t for t, tuples in live.items() if tuples])
        tuples = live[tree]
        token, w = tuples.pop(rng.randrange(len(tuples)))
        a = ackers[w]
        if steps < 60 and rng.random() < 0.5:  # the bolt emits anchored to it first, to other workers' tasks
            token = edges_of(token)
            for e in a.anchor([token], rng.randint(1, 2)):
                tuples.append((e, rng.randrange(n)))
        a.ack_many([token]) if rng.random() < 0.5 else a.ack(token)
        post()
        if rng.random() < 0.3:
            deliver(rng.randint(1, 3))
        check_completions()
    while live and any(live.values()):  # (200 steps reached: ack the rest)
        for tree, tuples in live.items():
            while tuples:
                token, w = tuples.pop()
                ackers[w].ack(token)
        post()
    deliver(len(in_transit))
    check_completions()
    assert done == set(range(n_trees))
    assert all(a.pending == 0 for a in ackers)


def test_no_tree_times_out_while_timeouts_are_held_and_one_past_its_deadline_fails_once_they_are_not():
    # (a host worker holds them from its checkpoint's cut to the commit or the rollback)
    zero, _ = _ackers(2, 5)
    zero.spout_emit(1, "m", 1, T0)
    zero.hold_timeouts = True
    assert zero.expire(T0 + 31) == 0 and zero.drain() == ([], []) and zero.pending == 1
    zero.hold_timeouts = False
    assert zero.expire(T0 + 31) == 1 and zero.drain() == ([], [(1, "m")])
    assert zero.stats["timed_out"] == 1


def test_a_committed_tree_whose_last_acks_are_on_another_worker_completes_at_its_deadline_not_fails():
    zero, one = _ackers(2, 6)
    r, (s,) = zero.spout_emit(1, "committed", 1, T0)
    zero.spout_emit(1, "not", 1, T0)
    (word,) = zero.anchor([s], 1)  # a word on worker 1, whose ack a checkpoint released there
    zero.ack(s)
    zero.committed = {r}
    assert zero.expire(T0 + 31) == 2
    assert zero.drain() == ([(1, "committed")], [(1, "not")])
    assert zero.stats == {"completed": 1, "failed": 1, "timed_out": 1}
    one.ack(word)  # its ack, come late: a finished tree's, ignored
    zero.apply_remote(*one.take_remote()[0])
    assert zero.drain() == ([], []) and zero.pending == 0
