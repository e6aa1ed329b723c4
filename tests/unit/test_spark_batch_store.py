"""The batch-versioned state store of the Spark topology engine
(adapters/spark/_streaming/state.py): a re-run batch starts from the state before it,
a later batch builds on the one before, a deletion is kept, the parallelism
is checked, snapshots bound what is read and kept. Real files, through the
checkpoint location's file system (a path, or a file:// URI)."""

from __future__ import annotations

import pytest

from multilang.adapters.spark._streaming.state import SNAPSHOT_EVERY, BatchStore, read_state
from multilang.errors import TopologyError
from multilang.shellbolt._runtime.state_store import Checkpoint


def _open(d, batch, task=0, tasks=2):
    return BatchStore({"dir": str(d), "component": "count", "task": task, "tasks": tasks, "batch": batch})


def _write(store, txid, put=None, delete=None):
    store.commit(Checkpoint(txid, changes={("count", 0): (put or {}, delete or [])}), {"count": 1})


def test_a_batch_builds_on_the_batches_before_it(tmp_path):
    s = _open(tmp_path, 0)
    assert s.load("count", 0) == {}
    _write(s, 1, {"a": 1, "b": 1})
    _write(s, 2, {"a": 2})  # a later checkpoint of the same attempt
    assert s.load("count", 0) == {"a": 2, "b": 1}
    s.close()
    s = _open(tmp_path, 1)
    assert s.load("count", 0) == {"a": 2, "b": 1}
    _write(s, 1, {"b": 5}, ["a"])
    assert s.load("count", 0) == {"b": 5}
    s.close()
    assert read_state(str(tmp_path), "count", 0) == {"b": 5}
    assert read_state(str(tmp_path), "count", 0, upto_batch=0) == {"a": 2, "b": 1}


def test_a_rerun_batch_starts_from_the_state_before_it(tmp_path):
    s = _open(tmp_path, 0)
    _write(s, 1, {"a": 1})
    s.close()
    s = _open(tmp_path, 1)
    _write(s, 1, {"a": 100})  # an attempt of batch 1 that Spark did not commit
    s.close()
    for _attempt in range(3):  # every re-run of batch 1 sees the state after batch 0
        s = _open(tmp_path, 1)
        assert s.load("count", 0) == {"a": 1}
        _write(s, 1, {"a": 2})
        s.close()
    s = _open(tmp_path, 2)
    assert s.load("count", 0) == {"a": 2}
    s.close()


def test_a_task_without_rows_in_some_batches_keeps_its_state(tmp_path):
    s = _open(tmp_path, 3)
    _write(s, 1, {"k": [1, {"x": None}]})
    s.close()
    s = _open(tmp_path, 9)
    assert s.load("count", 0) == {"k": [1, {"x": None}]}
    s.close()


def test_state_written_with_another_parallelism_is_refused(tmp_path):
    _open(tmp_path, 0, tasks=2).close()
    with pytest.raises(TopologyError, match="written with 2 task"):
        _open(tmp_path, 1, tasks=3)


def test_tasks_have_separate_files(tmp_path):
    a, b = _open(tmp_path, 0, task=0), _open(tmp_path, 0, task=1)
    _write(a, 1, {"w": 1})
    _write(b, 1, {"w": 7})
    a.close(), b.close()
    assert read_state(str(tmp_path), "count", 0) == {"w": 1}
    assert read_state(str(tmp_path), "count", 1) == {"w": 7}


def test_snapshots_bound_the_files_read_and_kept_and_the_state_stays_whole(tmp_path):
    uri = f"file://{tmp_path}"  # a file:// URI, as --checkpoint may be given (Hadoop's: literal)
    expected: dict[str, int] = {}
    n = 3 * SNAPSHOT_EVERY + 4
    for b in range(n):
        s = BatchStore({"dir": uri, "component": "count", "task": 0, "tasks": 1, "batch": b})
        assert s.load("count", 0) == expected
        put = {f"k{b}": b, "total": b}
        _write(s, 1, put, [f"k{b - 3}"] if b >= 3 else [])
        expected = {k: v for k, v in {**expected, **put}.items() if k != f"k{b - 3}"}
        s.close()
    assert read_state(uri, "count", 0) == expected
    names = sorted(p.name for p in (tmp_path / "count" / "task-0").iterdir())
    snaps = [x for x in names if x.endswith(".snapshot")]
    deltas = [x for x in names if x.endswith(".delta")]
    # a snapshot after every SNAPSHOT_EVERY batches (9, 19, 29: the 10th delta is never read), two kept
    assert snaps == [f"{b:012d}.snapshot" for b in (SNAPSHOT_EVERY * 2 - 1, SNAPSHOT_EVERY * 3 - 1)]
    assert deltas == [f"{b:012d}.delta" for b in range(SNAPSHOT_EVERY * 2, n)]
    # a re-run of the last batch starts from the state before it, snapshot and all
    last = BatchStore({"dir": uri, "component": "count", "task": 0, "tasks": 1, "batch": n - 1})
    assert last.load("count", 0) == read_state(uri, "count", 0, upto_batch=n - 2)


def test_a_task_with_rows_in_few_batches_still_writes_snapshots(tmp_path):
    uri = f"file://{tmp_path}"
    for b in range(0, 7 * SNAPSHOT_EVERY, 7):  # never a batch id divisible by the period's
        s = BatchStore({"dir": uri, "component": "count", "task": 0, "tasks": 1, "batch": b})
        _write(s, 1, {"n": b})
        s.close()
    files = [p.name for p in (tmp_path / "count" / "task-0").iterdir()]
    assert sum(f.endswith(".snapshot") for f in files) >= 1
    assert sum(f.endswith(".delta") for f in files) < 2 * SNAPSHOT_EVERY
    assert read_state(uri, "count", 0) == {"n": 7 * (SNAPSHOT_EVERY - 1)}
