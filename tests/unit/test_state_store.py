"""The state stores of stateful bolts (shellbolt/_runtime/state_store.py, docs/STATE.md):
what one checkpoint writes is there after a reopen, all or nothing, also when
the writing process is SIGKILLed mid-commit; a store refuses a topology of
another parallelism, a second run, and a file that is not one."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from multilang.errors import TopologyError
from multilang.shellbolt._runtime import state_store
from multilang.shellbolt._runtime.state_store import Checkpoint, MemoryStore, SqliteStore, msg_key, open_store


@pytest.fixture(params=["sqlite", "memory"])
def store(request, tmp_path):
    s = SqliteStore(str(tmp_path), "wc") if request.param == "sqlite" else MemoryStore()
    yield s
    s.close()


def test_a_checkpoint_is_loaded_back(store):
    assert store.txid is None and store.load("count", 0) == {} and not store.has_completed("spout")
    cp = Checkpoint(1, changes={("count", 0): ({"alice": 3, "deep": {"x": [1, None]}}, []),
                                ("count", 1): ({"rabbit": 1}, [])},
                    completed=[("spout", 0, msg_key(7)), ("spout", 0, msg_key("line-8"))],
                    outputs={'["alice"]': {"word": "alice", "count": 3}})
    store.commit(cp, {"count": 2})
    store.commit(Checkpoint(2, changes={("count", 0): ({"alice": 4}, ["deep"])}), {"count": 2})
    assert store.txid == 2
    assert store.load("count", 0) == {"alice": 4} and store.load("count", 1) == {"rabbit": 1}
    assert store.has_completed("spout") and not store.has_completed("other")
    assert store.completed("spout", 0, msg_key(7)) and store.completed("spout", 0, msg_key("line-8"))
    assert not store.completed("spout", 1, msg_key(7)) and not store.completed("spout", 0, msg_key("7"))
    assert store.outputs() == {'["alice"]': {"word": "alice", "count": 3}}


def test_sqlite_keeps_everything_across_a_reopen(tmp_path):
    s = SqliteStore(str(tmp_path), "wc")
    s.commit(Checkpoint(5, changes={("count", 1): ({"k": "v"}, [])}, completed=[("s", 0, "1")]), {"count": 2})
    s.close()
    s = SqliteStore(str(tmp_path), "wc")
    assert s.txid == 5 and s.load("count", 1) == {"k": "v"} and s.has_completed("s") and s.completed("s", 0, "1")
    with pytest.raises(TopologyError, match=r"component 'count' has state for 2 task\(s\), but this topology runs 3"):
        s.check("wc", {"count": 3, "split": 7})
    s.check("wc", {"count": 2, "split": 7})
    s.close()


def test_a_commit_that_fails_writes_nothing(store):
    store.commit(Checkpoint(1, changes={("c", 0): ({"a": 1}, [])}), {"c": 1})
    with pytest.raises(TypeError):
        store.commit(Checkpoint(2, changes={("c", 0): ({"a": 2, "b": {1, 2}}, [])}), {"c": 1})
    assert store.txid == 1 and store.load("c", 0) == {"a": 1}


def test_a_second_run_and_a_damaged_file_are_refused(tmp_path):
    s = SqliteStore(str(tmp_path), "wc")
    with pytest.raises(TopologyError, match=r"wc\.sqlite: another run is using it"):
        SqliteStore(str(tmp_path), "wc")
    s.close()
    (tmp_path / "bad.sqlite").write_bytes(b"this is not a database" * 100)
    with pytest.raises(TopologyError, match=r"bad\.sqlite"):
        SqliteStore(str(tmp_path), "bad")
    (tmp_path / "file").write_text("x")
    with pytest.raises(TopologyError, match=r"state directory .*file"):
        SqliteStore(str(tmp_path / "file"), "wc")


def test_providers_by_name(tmp_path):
    assert isinstance(open_store("sqlite", {"dir": str(tmp_path)}, "t", ""), SqliteStore)
    assert isinstance(open_store("memory", {}, "t", ""), MemoryStore)
    assert isinstance(open_store("multilang.shellbolt._runtime.state_store:MemoryStore", {}, "t", ""), MemoryStore)
    for bad, why in [("redis", "use one of"), ("no_such_module_x:Store", "No module named"),
                     ("multilang.shellbolt._runtime.state_store:Nope", "Nope")]:
        with pytest.raises(TopologyError, match=why):
            open_store(bad, {}, "t", "")


def test_message_ids_are_kept_as_canonical_json():
    assert msg_key({"b": 1, "a": [1, "x"]}) == msg_key({"a": [1, "x"], "b": 1}) == '{"a":[1,"x"],"b":1}'
    assert msg_key(7) != msg_key("7") and msg_key(object()) is None


def test_a_full_disk_is_reported_as_such_and_the_last_checkpoint_stays(tmp_path):
    store = SqliteStore(str(tmp_path), "wc")
    try:
        store.commit(Checkpoint(1, changes={("count", 0): ({"alice": 1}, [])}), {"count": 1})
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full from now on
        big = {f"key-{i}": "x" * 200 for i in range(2000)}
        with pytest.raises(Exception, match="database or disk is full"):
            store.commit(Checkpoint(2, changes={("count", 0): (big, [])}), {"count": 1})
        assert store.txid == 1 and store.load("count", 0) == {"alice": 1}
    finally:
        store.close()


@pytest.mark.parametrize("table, change, named", [
    ("kv", "UPDATE kv SET value = '90800' WHERE key = 'alice'", "the value of bolt 'count' task 0 key 'alice' does "
                                                                "not match its checksum"),
    ("kv", "UPDATE kv SET value = '{not json', crc = NULL", "the value of bolt 'count' task 0 key 'alice' is not JSON"),
    ("completed", "UPDATE completed SET msg_id = '8'", "a message id of spout 'spout' task 0 does not match its "
                                                       "checksum"),
    ("outputs", "UPDATE outputs SET record = '{\"word\":\"alice\",\"count\":90800}'", "the output of key [\"alice\"] "
                                                                                     "does not match its checksum"),
])
def test_a_stored_row_changed_on_disk_is_refused_when_the_store_is_opened(tmp_path, table, change, named):
    import sqlite3

    store = SqliteStore(str(tmp_path), "wc")
    store.commit(Checkpoint(1, changes={("count", 0): ({"alice": 10800}, [])}, completed=[("spout", 0, msg_key(7))],
                            outputs={'["alice"]': {"word": "alice", "count": 10800}}), {"count": 1})
    store.close()
    con = sqlite3.connect(tmp_path / "wc.sqlite")
    con.execute(change)
    con.commit()
    con.close()
    with pytest.raises(TopologyError) as err:
        SqliteStore(str(tmp_path), "wc")
    assert named in str(err.value) and "wc.sqlite is damaged" in str(err.value)


def test_a_store_written_before_checksums_gets_the_column_and_is_read(tmp_path):
    import sqlite3

    store = SqliteStore(str(tmp_path), "wc")
    store.commit(Checkpoint(1, changes={("count", 0): ({"alice": 3}, [])}), {"count": 1})
    store.close()
    con = sqlite3.connect(tmp_path / "wc.sqlite")
    con.execute("ALTER TABLE kv DROP COLUMN crc")  # as an earlier version wrote it
    con.commit()
    con.close()
    store = SqliteStore(str(tmp_path), "wc")
    try:
        assert store.load("count", 0) == {"alice": 3}
        store.commit(Checkpoint(2, changes={("count", 0): ({"alice": 4}, [])}), {"count": 1})
    finally:
        store.close()
    assert SqliteStore(str(tmp_path), "wc").load("count", 0) == {"alice": 4}


def test_a_reader_holding_the_store_for_a_moment_does_not_make_a_run_refuse_it(tmp_path, monkeypatch):
    # A reader (a script polling the checkpoints, a backup) has the store open, in a read
    # transaction, at the instant a run opens it: the run waits, and takes the store once the
    # reader is done. Before, it said "another run is using it" and the run exited with 2.
    # (the wait made long here: the pass condition is that the run waited for the reader, whatever
    # the machine's pace; the product's 2 s is a constant)
    monkeypatch.setattr(state_store, "_READER_PATIENCE", 60.0)
    SqliteStore(str(tmp_path), "wc").close()
    reader = sqlite3.connect(tmp_path / "wc.sqlite", isolation_level=None, check_same_thread=False)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM meta").fetchone()  # the shared lock, held

    def done() -> None:
        reader.rollback()
        reader.close()

    let_go = threading.Timer(0.3, done)
    let_go.start()
    try:
        s = SqliteStore(str(tmp_path), "wc")
    finally:
        let_go.join()
    s.commit(Checkpoint(1, changes={("count", 0): ({"k": 1}, [])}), {"count": 1})
    assert s.txid == 1
    s.close()
