"""Deliberately broken components (tests/conformance/broken/, raw stdio, no
library): each must fail the specific check for its bug, with the rule named,
while unrelated checks still pass."""

import pytest

from conform_support import BROKEN, PY
from multilang.conform import FAILED, PASSED


def _script(name):
    return [PY, str(BROKEN / f"broken_{name}.py")]


def _assert_failed(report, check_ids, rule, contains=None):
    for cid in check_ids:
        r = report[cid]
        assert r.status == FAILED, f"{cid} should fail:\n{report.to_text()}"
        assert r.rule == rule, f"{cid}: rule {r.rule!r}, expected {rule!r}: {r.reason}"
        if contains:
            assert contains in r.reason, r.reason
        assert r.frames, "a failure shows the frames involved"


def _assert_passed(report, check_ids):
    bad = [cid for cid in check_ids if report[cid].status != PASSED]
    assert not bad, f"{bad} should pass:\n{report.to_text()}"


def test_numeric_ack_ids(conform):
    report = conform(_script("numeric_ack_ids"), timeout=1.5)
    _assert_failed(
        report,
        ["bolt.ack-id.min-int64", "bolt.ack-id.max-int64", "bolt.ack-id.leading-zeros", "bolt.ack-id.small",
         "bolt.tuple-acked-or-failed", "framing.crlf"],
        "ids.string-echo",
        contains="echoed as the exact string",
    )
    # The reason is the core's (ProtocolError of the host-side Connection): it names the id as sent.
    assert "component acks id 12 " in report["bolt.ack-id.leading-zeros"].reason
    _assert_passed(report, ["handshake.pid-reply", "handshake.pid-file", "heartbeat.answered-with-sync",
                            "heartbeat.several", "eof.after-handshake"])
    # The offending frame is in the report.
    assert any('"id": 12' in f or '"id":12' in f for f in report["bolt.ack-id.leading-zeros"].frames)


def test_acks_heartbeats(conform):
    report = conform(_script("acks_heartbeats"), timeout=1.5)
    _assert_failed(
        report,
        ["heartbeat.answered-with-sync", "heartbeat.never-acked", "heartbeat.several", "heartbeat.between-tuples"],
        "heartbeat.never-acked",
        contains="heartbeat id",
    )
    _assert_passed(report, ["bolt.ack-id.min-int64", "bolt.ack-id.leading-zeros", "bolt.ack-id.small",
                            "bolt.tuple-acked-or-failed", "handshake.pid-file", "framing.coalesced",
                            "eof.after-handshake"])


def test_no_pid_file(conform):
    report = conform(_script("no_pid_file"), timeout=1.5)
    _assert_failed(report, ["handshake.pid-file"], "handshake.pid-file", contains="no pid file")
    # Neither Storm nor our host reads the pid file: a warning (recommended), and
    # the handshake variants only check a pid file that was written.
    assert report["handshake.pid-file"].level == "recommended" and report.is_warning(report["handshake.pid-file"])
    _assert_passed(report, ["handshake.pid-reply", "handshake.nothing-before-pid", "bolt.ack-id.small",
                            "heartbeat.answered-with-sync", "eof.after-handshake", "handshake.escaped-slashes"])


def test_garbage_before_pid(conform):
    report = conform(_script("garbage_before_pid"), timeout=1.5)
    _assert_failed(report, ["handshake.nothing-before-pid", "handshake.pid-reply", "bolt.ack-id.small"],
                   "handshake.pid-first", contains="starting up")
    # Every vector needs a pid reply first: nothing can pass.
    assert report.passed == 0


def test_missing_sync_spout(conform):
    report = conform(_script("missing_sync_spout"), role="spout", timeout=0.5)
    _assert_failed(
        report,
        ["spout.activate-sync", "spout.next-sync", "spout.deactivate-sync", "spout.unknown-command-sync"],
        "expect.timeout",
        contains='{"command": "sync"}',
    )
    _assert_passed(report, ["handshake.pid-reply", "handshake.pid-file", "eof.after-handshake"])


def test_spins_on_eof(conform):
    report = conform(_script("spins_on_eof"), timeout=0.5, select="eof.after")
    _assert_failed(report, ["eof.after-handshake", "eof.after-tuples"], "process.exit", contains="did not exit within 2000 ms")
    assert len([r for r in report.results if r.status != "not-applicable"]) == 2  # msgpack.eof.*: no msgpack here


@pytest.mark.parametrize("role", ["bolt", "spout"])
def test_a_command_that_is_not_a_component(conform, role):
    # `cat` echoes the handshake back: the first frame is not a pid reply.
    report = conform(["cat"], role=role, timeout=0.5, select="handshake.pid-reply")
    _assert_failed(report, ["handshake.pid-reply"], "handshake.pid-first", contains="pidDir")


def test_reformatted_ack_ids(conform):
    # The core names the rule (ids.known); the runner's transcript adds the ids it sent.
    report = conform(_script("trimmed_ack_ids"), timeout=1.5)
    _assert_failed(report, ["bolt.ack-id.small", "bolt.ack-id.leading-zeros"], "ids.known", contains="ids sent: ")
    assert "which is not a pending tuple" in report["bolt.ack-id.small"].reason
