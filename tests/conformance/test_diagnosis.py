"""Root-cause diagnosis (multilang/conform/_diagnosis.py).

Unit tests on hand-built results, then the real runner against the known-broken
components in tests/conformance/broken/ (one per diagnosis) on a few vectors
each, with a 1 s wait to keep the file fast."""

import pytest

from conform_support import BROKEN, PY, ROOT
from multilang.conform import CheckResult
from multilang.conform._diagnosis import Diagnosis, diagnose

ACK_WAIT = 'nothing matching {"command": {"$one-of": ["ack", "fail"]}, "id": "%s"} within 2.0 s'
PID = "<- {\"pid\": 4242}"


def _tuple(tid, sep="\\n"):
    return f'-> {{"id":"{tid}","comp":"source","stream":"default","task":1,"tuple":["a b"]}}{sep}end{sep}'


def _res(cid, status="failed", rule="", reason="", frames=(), duration=0.1, stderr=""):
    return CheckResult(id=cid, title=cid, spec=[], file="x.json", status=status, reason=reason, rule=rule,
                       step="step 2", frames=list(frames), stderr=stderr, duration=duration)


def _never_acked(cid, tid, emits=True, wait=2.0, sep="\\n"):
    frames = ["-> {\"pidDir\":\"/tmp/x\"}\\nend\\n", PID, _tuple(tid, sep)]
    if emits:
        frames += ['<- {"command":"emit","anchors":[],"tuple":["a"]}', "-> [4]\\nend\\n [automatic task-id reply]"]
    reason = (ACK_WAIT % tid).replace("within 2.0 s", f"within {wait:.1f} s")
    return _res(cid, rule="expect.timeout", reason=reason, frames=frames, duration=wait + 0.05)


# -- unit tests -------------------------------------------------------------


def test_nothing_wrong_gives_nothing():
    assert diagnose([]) == []
    assert diagnose([_res("a", status="passed"), _res("b", status="not-applicable")]) == []


@pytest.mark.parametrize("junk", [None, 3, "text", [None], [object()], [{"status": "failed", "frames": 7}],
                                  [{"status": "failed", "rule": "expect.timeout", "reason": None, "duration": "x"}]])
def test_odd_data_never_raises(junk):
    assert isinstance(diagnose(junk), list)


def test_never_acks_groups_the_ack_timeouts_only():
    results = [_never_acked(f"c{i}", str(i)) for i in range(3)]
    results.append(_res("own", rule="handshake.pid-file", reason="no pid file", frames=[PID]))
    results.append(_res("ok", status="passed"))
    [d] = diagnose(results)
    assert isinstance(d, Diagnosis)
    assert d.title == "never acks or fails (0 of 3 tuples answered)"
    assert d.checks == ["c0", "c1", "c2"]  # "own" failed for its own reason
    assert "no check waited longer" in d.detail


def test_never_acks_says_when_a_longer_wait_was_tried():
    results = [_never_acked("a", "1"), _never_acked("b", "2"), _never_acked("big", "3", wait=15.0)]
    [d] = diagnose(results)
    assert d.title.startswith("never acks or fails")
    assert "not even within 15.0 s" in d.detail


def test_an_ack_anywhere_means_no_never_acks():
    results = [_never_acked("a", "1"), _never_acked("b", "2")]
    results.append(_res("c", rule="expect.mismatch", reason="expected x",
                        frames=[_tuple("9"), '<- {"command": "ack", "id": "9"}']))
    assert diagnose(results) == []


def test_silence_on_oddly_framed_tuples_is_not_never_acks():
    # storm.py cannot read \r\n framing: it stays silent on exactly those tuples and acks the rest.
    results = [_never_acked(f"crlf{i}", str(i), emits=False, sep="\\r\\n") for i in range(4)]
    results += [_res(f"ok{i}", status="passed") for i in range(20)]
    assert diagnose(results) == []


def test_late_acks_from_a_longer_check_that_passed():
    results = [_never_acked("a", "1", emits=False), _never_acked("b", "2", emits=False)]
    results.append(_res("slow", status="passed", duration=3.6))
    [d] = diagnose(results)
    assert d.title == "answers only after about 3.6 s"
    assert d.checks == ["a", "b"] and "slow" in d.detail


def test_exits_on_first_tuple():
    frames = ["-> {\"pidDir\":\"/tmp/x\"}\\nend\\n", PID, _tuple("1")]
    results = [
        _res("a", rule="process.exited", frames=frames, stderr="Traceback\nKeyError: 'x'\n",
             reason='the component closed its stdout (exit status 1) while the runner waited for matching {"command": "ack"}'),
        _res("b", rule="process.exit-code", frames=frames + ["-> [stdin closed]"],
             reason="the component exited with status 1, expected 0"),
        # wrote something after the tuple: not this diagnosis
        _res("c", rule="process.exited", frames=frames + ['<- {"command": "error", "msg": "x"}'],
             reason="the component closed its stdout while the runner waited for x"),
    ]
    [d] = diagnose(results)
    assert d.title == "exits on the first tuple (exit status 1)"
    assert d.checks == ["a", "b"] and "KeyError: 'x'" in d.detail


def test_garbage_stdout_shows_first_bytes():
    reason = 'the component wrote a frame that is not JSON (§1.1, §1.2): hello there\\n{"command": "ack"}'
    results = [_res(c, rule="frame.json", reason=reason, frames=[PID]) for c in ("a", "b")]
    results.append(_res("c", rule="handshake.pid-first",
                        reason='the first thing ... (§2.3); it wrote: starting...\\n{"pid": 1}'))
    [d] = diagnose(results)
    assert d.title.startswith("stdout is not protocol (first bytes: hello there")
    assert d.checks == ["a", "b", "c"]


def test_heartbeats_unanswered():
    hb = '-> {"id":"1","comp":null,"stream":"__heartbeat","task":-1,"tuple":[]}\\nend\\n'
    results = [
        _res("a", rule="expect.timeout", reason='nothing matching {"command": "sync"} within 2.0 s', frames=[PID, hb]),
        _res("b", rule="expect.count", reason='expected 3 frame(s) matching {"command": "sync"} in this conversation, got 0',
             frames=[PID, hb]),
    ]
    [d] = diagnose(results)
    assert d.title == "does not answer heartbeats (0 of 2 heartbeats answered with sync)"
    assert d.checks == ["a", "b"]
    results.append(_res("c", rule="expect.mismatch", reason="x", frames=[hb, '<- {"command": "sync"}']))
    assert diagnose(results) == []


def test_handshake_never_completed_comes_first_and_claims_its_checks():
    hs = [_res(c, rule="handshake.timeout", reason="no pid reply within 2.0 s of the handshake (§2.3, §2.4)",
               frames=["-> {\"pidDir\":\"/tmp/x\"}\\nend\\n"]) for c in ("a", "b", "c")]
    [d] = diagnose(hs)
    assert d.title == "never completes the handshake (no pid reply)"
    assert d.checks == ["a", "b", "c"]
    # one handshake failure among many passes is that check's own business
    assert diagnose(hs[:1] + [_res(f"ok{i}", status="passed") for i in range(5)]) == []


def test_accepts_json_dicts():
    results = [_never_acked(f"c{i}", str(i)).to_json() for i in range(2)]
    assert [d.title for d in diagnose(results)] == ["never acks or fails (0 of 2 tuples answered)"]


# -- against the known-broken components ------------------------------------

FAST = dict(role="bolt", timeout=1.0)


def _broken(name):
    return [PY, str(BROKEN / f"{name}.py")]


def _failed(results):
    return [r.id for r in results if r.status == "failed"]


def _check(results, title_start, grouped=None):
    ds = diagnose(results)
    assert ds, f"no diagnosis; failed: {_failed(results)}"
    assert ds[0].title.startswith(title_start), [d.title for d in ds]
    want = set(grouped if grouped is not None else _failed(results))
    assert want and want <= set(ds[0].checks), (sorted(want), ds[0].checks)
    return ds[0]


def test_component_never_acks(conform):
    report = conform(_broken("never_acks"), select="bolt.ack-id", **FAST)
    d = _check(report.results, "never acks or fails (0 of 4 tuples answered)")
    assert "It emits" in d.detail


def test_component_acks_late(conform):
    # The ack-id checks wait 1 s; framing.large-tuple waits 15 s and passes after ~3.5 s.
    results = conform(_broken("acks_late"), select="bolt.ack-id", **FAST).results
    results += conform(_broken("acks_late"), select="framing.large-tuple", **FAST).results
    assert "framing.large-tuple" not in _failed(results)
    d = _check(results, "answers only after about ")
    # The component sleeps 3.5 s before it answers: the time named is at least that, however busy
    # the machine (which can only add to it).
    assert float(d.title.rsplit(" ", 2)[1]) >= 3.5, d.title
    assert "framing.large-tuple" in d.detail


def test_component_exits_on_first_tuple(conform):
    report = conform(_broken("exits_on_first_tuple"), select="bolt.ack-id", **FAST)
    _check(report.results, "exits on the first tuple (exit status 1)")


def test_the_exit_status_is_named_when_the_exit_comes_after_the_closed_stdout(conform):
    # The runner sees stdout close 0.3 s before the exit: it waits for the
    # exit (on a pidfd) instead of reporting whichever came first.
    report = conform(_broken("exits_on_first_tuple") + ["--slowly"], select="bolt.ack-id", **FAST)
    failed = [r for r in report.results if r.status == "failed"]
    assert failed and all("(exit status 3)" in r.reason for r in failed), [r.reason for r in failed]
    _check(report.results, "exits on the first tuple (exit status 3)")


def test_component_garbage_stdout(conform):
    report = conform(_broken("garbage_stdout"), select="bolt.ack-id", **FAST)
    _check(report.results, "stdout is not protocol (first bytes: DEBUG got tuple")


def test_component_ignores_heartbeats(conform):
    report = conform(_broken("ignores_heartbeats"), select="heartbeat.", **FAST)
    _check(report.results, "does not answer heartbeats (0 of ")


def test_component_no_pid_reply(conform):
    report = conform(_broken("no_pid_reply"), select="bolt.ack-id.m", **FAST)
    _check(report.results, "never completes the handshake")


def test_a_spout_checked_as_a_bolt_is_told_to_use_role_spout(conform):
    # No ready line says what it is, so the checks run it as a bolt; our
    # library says a spout got a tuple, and the diagnosis turns that into
    # the flag to use (before: 30 failures with a traceback, and no hint).
    spout = [PY, str(ROOT / "examples" / "python" / "sentence_spout.py"), str(ROOT / "examples" / "data" / "alice.txt")]
    report = conform(spout, select="bolt.ack-id", **FAST)
    plain = [r.id for r in report.results if r.id.startswith("bolt.ack-id")]
    _check(report.results, "exits on the first tuple (exit status 1); it is a spout: run with --role spout", plain)


@pytest.mark.parametrize("select", ["bolt.ack-id", "heartbeat."])
def test_correct_component_gets_no_diagnosis(conform, select):
    report = conform([PY, str(ROOT / "examples" / "python" / "split_bolt.py")], select=select, **FAST)
    assert not _failed(report.results), report.to_text()
    assert diagnose(report.results) == []
