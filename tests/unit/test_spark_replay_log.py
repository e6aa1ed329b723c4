"""The replay log of the Spark source (adapters/spark/_source/replay_log.py)
at a URI: its files go through the file system layer, its record of message
ids lives on the driver's disk, and a driver that finds no record for a log
with committed positions (it moved to another machine) knows the record is
missing: dedupe=all refuses the log instead of letting repeats through;
without dedupe the log goes on. Real files."""

from __future__ import annotations

import pytest

from multilang.adapters.spark._source.replay_log import IDS_FILE, _id_key, _ReplayLog


def _records(n: int, start: int = 0) -> tuple[list, list]:
    records = [(f"m{i}", [f"sentence {i}"]) for i in range(start, start + n)]
    ids = [(_id_key(m), off, b"digest00") for off, (m, _v) in enumerate(records)]
    return records, ids


def test_a_replay_log_at_a_uri_keeps_its_files_there_and_its_id_record_on_the_drivers_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    where = tmp_path / "ck dir" / "spouts"
    log = _ReplayLog(f"file://{where}", record_ids=True)
    assert log.append(*_records(3)) == (0, 3)
    assert log.append(*_records(2, 3)) == (3, 5)
    log.mark_committed(3)
    assert [r["id"] for r in log.read(3, 5)] == ["m3", "m4"]
    log.close()
    assert sorted(p.name for p in where.iterdir()) == ["batch-000000000003-000000000005.jsonl", "committed.json",
                                                       "meta.json"]
    assert len(list((tmp_path / "cache").rglob(IDS_FILE))) == 1
    again = _ReplayLog(f"file://{where}", record_ids=True)  # the same driver: everything is there
    assert (again.committed, again.end) == (3, 5)
    assert again.ids is not None and again.ids.lookup(_id_key("m1"))[0] == 1
    again.close()


def test_a_driver_without_the_id_record_refuses_the_log_with_dedupe_all_and_goes_on_without(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    where = f"file://{tmp_path / 'spouts'}"
    log = _ReplayLog(where, record_ids=True)
    log.append(*_records(4))
    log.mark_committed(2)
    log.close()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "another machine"))
    with pytest.raises(RuntimeError, match=r"message ids of committed positions 0\.\.2 were not recorded"):
        _ReplayLog(where, record_ids=True)
    moved = _ReplayLog(where, record_ids=False)  # dedupe=inflight: at least once across spout restarts
    assert [r["id"] for r in moved.read(2, 4)] == ["m2", "m3"]
    moved.close()
