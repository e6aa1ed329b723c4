"""Extension batch (§9.5) in the conformance runner: the vectors of
spec/vectors/batch.json, the handshake offer, and the rules checked on output
batches (with a raw, library-free bolt: tests/conformance/broken/broken_batch.py)."""

import json

import pytest

from conform_support import BROKEN, PY
from multilang.conform import FAILED, PASSED, load_vectors

VECTORS = load_vectors()
BATCH = [v for v in VECTORS if v.file == "batch"]


def _offered(v):
    if not isinstance(v.handshake, dict):
        return None
    return v.handshake.get("extensions")


def test_batch_vectors_exist_and_cite_section_9():
    assert len(BATCH) >= 10
    cited = {s for v in BATCH for s in v.spec}
    assert {"9.2", "9.5"} <= cited
    assert all(v.requires in ("bolt", "basic", "spout") for v in BATCH)
    assert {v.requires for v in BATCH} == {"bolt", "basic", "spout"}


def test_only_extension_vectors_offer_extensions():
    offering = {v.id for v in VECTORS if _offered(v)}
    assert offering and offering <= {v.id for v in VECTORS if v.file in ("batch", "msgpack", "state")}
    # every msgpack vector offers msgpack and is marked as being about it (§9.6)
    assert all("msgpack" in _offered(v) and v.extension == "msgpack" for v in VECTORS if v.file == "msgpack")
    # ... and some batch vectors check the standard mode without an offer.
    assert any(not _offered(v) for v in BATCH)


# -- the runner against a raw batching bolt ------------------------------------

VECTOR_FILE = {
    "vectors": [
        {
            "id": "t.offered",
            "title": "offered: accepted, tuple batches acked in an output batch",
            "spec": ["9.5"], "role": "bolt", "requires": "protocol",
            "handshake": {"extensions": ["batch"]},
            "steps": [
                {"expect_count": {"pid": {"$type": "integer"}, "extensions": ["batch"]}, "count": 1},
                {"send": {"tuples": [["1", "s", "default", 1, ["a"]], ["2", "s", "default", 1, ["b"]]]}},
                {"expect": {"command": "batch", "acks": ["1", "2"]}},
                {"send": {"id": "hb", "comp": None, "stream": "__heartbeat", "task": -1, "tuple": []}},
                {"expect": {"command": "sync"}},
            ],
        },
        {
            "id": "t.not-offered",
            "title": "not offered: standard frames",
            "spec": ["9.3"], "role": "bolt", "requires": "protocol",
            "steps": [
                {"send": {"id": "7", "comp": "s", "stream": "default", "task": 1, "tuple": ["a"]}},
                {"expect": {"command": "ack", "id": "7"}},
            ],
        },
    ]
}


@pytest.fixture(scope="module")
def vector_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("batch-vectors")
    (d / "t.json").write_text(json.dumps(VECTOR_FILE), encoding="utf-8")
    return d


def _run(conform, vector_dir, mode):
    return conform([PY, str(BROKEN / "broken_batch.py"), mode], vectors_dir=vector_dir, timeout=1.0)


def test_a_correct_raw_batcher_passes(conform, vector_dir):
    report = _run(conform, vector_dir, "good")
    assert report.passed == 2, report.to_text()


def test_an_expected_batch_may_come_in_several_batch_frames(conform, vector_dir):
    # §9.5: a writer may close a batch at any point; a library's flush clock
    # does so on a slow machine. Their elements, in order, are the batch.
    assert _run(conform, vector_dir, "split").passed == 2


def test_batch_frames_in_a_row_that_still_lack_an_element_fail_the_vector(conform, vector_dir):
    report = _run(conform, vector_dir, "split-short")
    r = report["t.offered"]
    assert r.status == FAILED and r.rule == "expect.mismatch", report.to_text()
    assert "'acks': ['1']" in r.reason or '"acks": ["1"]' in r.reason, r.reason


@pytest.mark.parametrize(
    "mode,check,rule,contains",
    [
        ("unoffered", "t.not-offered", "handshake.extensions", "not offered"),
        ("twice", "t.offered", "handshake.extensions", "['batch', 'batch']"),
        ("unnegotiated", "t.not-offered", "batch.negotiated", "without the batch extension"),
        ("numeric-ack", "t.offered", "ids.string-echo", "must be the string it was given, got int"),
        ("unknown-ack", "t.offered", "ids.known", "'no-such-id'"),
        ("double-ack", "t.offered", "ids.known", "twice in one batch"),
        ("bad-anchor", "t.offered", "anchors.known", "'no-such-id'"),
    ],
)
def test_broken_batchers_fail_the_named_rule(conform, vector_dir, mode, check, rule, contains):
    report = _run(conform, vector_dir, mode)
    r = report[check]
    assert r.status == FAILED, report.to_text()
    assert r.rule == rule, (r.rule, r.reason)
    assert contains in r.reason, r.reason
    if mode != "unnegotiated":  # it also declines the offer, failing t.offered
        other = "t.offered" if check == "t.not-offered" else "t.not-offered"
        assert report[other].status == PASSED, report.to_text()
