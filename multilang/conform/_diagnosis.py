"""Root-cause diagnosis for a conformance run.

Pure functions over the :class:`~multilang.conform.CheckResult` list of one
``multilang conform`` run: no I/O. :func:`diagnose` looks at the whole run and
names the few underlying faults (``never acks or fails``, ...) that explain
many failed checks, listing for each the failed checks that are only its
consequences. Checks that failed for their own reason are left out.

Everything is read from what the runner records for a failed check: ``rule``
(``expect.timeout``, ``process.exited``, ``frame.json``, ...), ``reason``
(``nothing matching {"command": {"$one-of": ["ack", "fail"]}, ...} within
2.0 s``), ``frames`` (the last frames of the conversation, ``"-> ..."`` sent
and ``"<- ..."`` received, each cut to a few hundred bytes) and ``duration``.
Passed checks carry no frames; only their durations are used (a check that
passed after waiting longer than the others' timeout shows that answers do
come, only late).

Diagnoses, most fundamental first (a failed check is grouped under the first
one that explains it):

- ``never completes the handshake``: checks stopped at the handshake
  (``handshake.timeout``, or stdout closed before the pid reply) and no pid
  reply was seen anywhere.
- ``stdout is not protocol``: frames that are not JSON (``frame.json``), or
  non-JSON bytes written before the pid reply (``handshake.pid-first``).
- ``acks a tuple twice``: an ack or fail of an id the component had
  settled already (``ids.known``, "it acked that tuple already"): one such
  check is enough.
- ``exits on the first tuple``: the process went away (``process.*`` rules)
  right after the first tuple was sent, without writing anything after it.
- ``never acks or fails`` / ``answers only after T s``: checks timed out
  waiting for an ack/fail while no ack or fail frame was received in any
  failed check; "late" when some check that waits longer passed after more
  than the usual wait, "never" otherwise (and the detail says whether a longer
  wait was tried).
- ``does not answer heartbeats``: checks that sent a heartbeat timed out
  waiting for ``sync`` and no sync was received anywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

__all__ = ["Diagnosis", "diagnose", "syncs_tuples"]

#: A diagnosis needs at least this many failed checks it explains: one odd
#: failure is that check's own business.
MIN_CHECKS = 2

_FIRST_BYTES = 40


@dataclass(frozen=True)
class Diagnosis:
    """One root cause drawn from the whole run."""

    #: Short headline, e.g. ``"never acks or fails (0 of 12 tuples answered)"``.
    title: str
    #: One or two sentences: the evidence and what it explains.
    detail: str
    #: Ids of the failed checks that failed only as a consequence of this.
    checks: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------
# Reading one result (CheckResult, or its to_json() dict), defensively
# ---------------------------------------------------------------------------


class _R:
    """The fields of one result that diagnosis reads, normalised."""

    __slots__ = ("id", "status", "rule", "reason", "frames", "stderr", "duration")

    def __init__(self, r: Any) -> None:
        get: Callable[[str], Any] = r.get if isinstance(r, dict) else (lambda k: getattr(r, k, None))
        self.id = _text(get("id"))
        self.status = _text(get("status"))
        self.rule = _text(get("rule"))
        self.reason = _text(get("reason"))
        frames = get("frames")
        self.frames = [_text(f) for f in frames] if isinstance(frames, (list, tuple)) else []
        self.stderr = _text(get("stderr"))
        d = get("duration")
        self.duration = float(d) if isinstance(d, (int, float)) and not isinstance(d, bool) else 0.0


def _text(v: Any) -> str:
    if v is None:
        return ""
    return v if isinstance(v, str) else str(v)


def _sent(frame: str) -> bool:
    return frame.startswith("-> ")


def _received(frame: str) -> bool:
    return frame.startswith("<- ")


_TUPLE_ID = re.compile(r'"id"\s*:\s*"')
_HEARTBEAT = '"__heartbeat"'


def _is_tuple(frame: str) -> bool:
    """A sent bolt tuple (not a heartbeat): has an id and a tuple."""
    return _sent(frame) and '"tuple"' in frame and bool(_TUPLE_ID.search(frame)) and _HEARTBEAT not in frame.split("end", 1)[0]


def _is_heartbeat(frame: str) -> bool:
    return _sent(frame) and _HEARTBEAT in frame


_ACK_FRAME = re.compile(r'"command"\s*:\s*"(?:ack|fail)"')
_SYNC_FRAME = re.compile(r'"command"\s*:\s*"sync"')
_PID_FRAME = re.compile(r'^<- \s*\{\s*"pid"\s*:')
# In a reason: an expected pattern that is an ack/fail, or a sync.
_ACK_PATTERN = re.compile(r'"command"\s*:\s*(?:"(?:ack|fail)"|\{\s*"\$one-of"\s*:\s*\[[^\]]*"(?:ack|fail)")')
_SYNC_PATTERN = re.compile(r'"command"\s*:\s*"sync"')
_WITHIN = re.compile(r"within (\d+(?:\.\d+)?) s")
_MORE_OF = re.compile(r"matching (\d+) more of")
_EXIT_STATUS = re.compile(r"exit(?:ed with)? status (-?\d+)")


def _waited_for(reason: str) -> str:
    """The part of a timeout/EOF reason that names what was awaited."""
    for key in ("nothing matching", "waited for matching", "expected "):
        i = reason.find(key)
        if i >= 0:
            return reason[i:]
    return ""


def _is_timeout(r: _R) -> bool:
    return r.rule == "expect.timeout" or (not r.rule and r.reason.startswith("nothing matching"))


def _ack_wait(r: _R) -> bool:
    """Failed because no ack/fail came within the wait."""
    return _is_timeout(r) and bool(_ACK_PATTERN.search(_waited_for(r.reason)))


def _waited(r: _R) -> float | None:
    m = _WITHIN.search(r.reason)
    return float(m.group(1)) if m else None


def _awaited_count(r: _R) -> int:
    m = _MORE_OF.search(r.reason)
    return int(m.group(1)) if m else 1


def _plain_tuple(frame: str) -> bool:
    """A tuple frame any component can read: one line, '\\n' endings, one write."""
    body = frame[3:]
    return "\\r" not in body and "[written in" not in body and body.rstrip().endswith("\\nend\\n")


def syncs_tuples(results: list[_R]) -> bool:
    """Whether a check answered a tuple with sync, as a spout answers its
    commands: a spout run as a bolt (``multilang conform`` does not wait
    longer for one, it will never ack)."""
    return any(_syncs_tuples(r) for r in results)


def _syncs_tuples(r: _R) -> bool:
    """A sync came back right after a tuple (not a heartbeat) was sent."""
    last_sent_tuple = False
    for f in r.frames:
        if _sent(f):
            last_sent_tuple = _is_tuple(f) and not _is_heartbeat(f)
        elif last_sent_tuple and _received(f) and _SYNC_FRAME.search(f):
            return True
    return False


def _handled_visibly(r: _R) -> bool:
    """The component was alive and reading after a tuple: it wrote some frame
    after the last visible tuple, or that tuple was plainly framed (so a
    silent component can't blame the framing)."""
    last = None
    for i, f in enumerate(r.frames):
        if _is_tuple(f):
            last = i
    if last is None:
        # The tuple scrolled out of the shown frames: anything received after the pid counts.
        return any(_received(f) and not _PID_FRAME.match(f) for f in r.frames)
    if any(_received(f) for f in r.frames[last + 1:]):
        return True
    return _plain_tuple(r.frames[last])


def _first_bytes(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _FIRST_BYTES else text[:_FIRST_BYTES] + "..."


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:160] if lines else ""


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _fmt_s(x: float) -> str:
    return f"{x:.1f} s"


# ---------------------------------------------------------------------------
# The diagnoses
# ---------------------------------------------------------------------------


def _handshake(failed: list[_R], everything: list[_R]) -> Diagnosis | None:
    def stuck(r: _R) -> bool:
        return r.rule == "handshake.timeout" or (
            r.rule == "process.exited" and "before its pid reply" in r.reason
        )

    hit = [r for r in failed if stuck(r)]
    if len(hit) < MIN_CHECKS or 2 * len(hit) < len(failed):
        return None
    if any(_PID_FRAME.match(f) for r in failed for f in r.frames):
        return None  # it does answer, sometimes: these are the checks' own business
    timeouts = [r for r in hit if r.rule == "handshake.timeout"]
    if timeouts:
        w = _waited(timeouts[0])
        how = f"no {{\"pid\": N}} reply within {_fmt_s(w)}" if w is not None else "no {\"pid\": N} reply"
    else:
        m = _EXIT_STATUS.search(hit[0].reason)
        how = "its stdout closed before the pid reply" + (f" (exit status {m.group(1)})" if m else "")
    err = _last_line(hit[0].stderr)
    detail = (
        f"{_plural(len(hit), 'check')} stopped at the handshake: {how} (§2.3). "
        "Nothing after the handshake was tested in them."
        + (f" stderr: {err}" if err else "")
    )
    return Diagnosis("never completes the handshake (no pid reply)", detail, [r.id for r in hit])


def _garbage(failed: list[_R], everything: list[_R]) -> Diagnosis | None:
    shown: list[str] = []

    def bad(r: _R) -> bool:
        if r.rule == "frame.json":
            i = r.reason.find("): ")
            shown.append(r.reason[i + 3:] if i >= 0 else "")
            return True
        if r.rule == "handshake.pid-first":
            i = r.reason.find("it wrote: ")
            body = r.reason[i + len("it wrote: "):] if i >= 0 else ""
            if body and body.lstrip()[:1] not in ("{", "["):
                shown.append(body)
                return True
        return False

    hit = [r for r in failed if bad(r)]
    if len(hit) < MIN_CHECKS:
        return None
    first = _first_bytes(next((s for s in shown if s), ""))
    detail = (
        f"{_plural(len(hit), 'check')} failed on stdout bytes that are not a JSON frame "
        f"(first bytes: {first}). Only frames go to stdout (§1); print debug output "
        "to stderr or use the log command."
    )
    return Diagnosis(f"stdout is not protocol (first bytes: {first})", detail, [r.id for r in hit])


def _exits(failed: list[_R], everything: list[_R]) -> Diagnosis | None:
    def gone(r: _R) -> bool:
        if not (r.rule.startswith("process.") or "closed its stdout" in r.reason
                or "cannot write to the component's stdin" in r.reason):
            return False
        if r.rule in ("process.spin", "process.exit"):  # did not exit: something else
            return False
        first = next((i for i, f in enumerate(r.frames) if _is_tuple(f)), None)
        if first is None:
            return False
        return not any(_received(f) for f in r.frames[first + 1:])

    hit = [r for r in failed if gone(r)]
    if len(hit) < MIN_CHECKS:
        return None
    status = next((m.group(1) for m in (_EXIT_STATUS.search(r.reason) for r in hit) if m), None)
    err = next((_last_line(r.stderr) for r in hit if r.stderr.strip()), "")
    title = "exits on the first tuple" + (f" (exit status {status})" if status is not None else "")
    if "this spout got a tuple" in err:  # our libraries' words (codec.decode_host_frame)
        title += "; it is a spout: run with --role spout"
    detail = (
        f"In {_plural(len(hit), 'check')} the process went away right after the first tuple was "
        "sent, without writing anything after it; every check that needed an answer to it failed."
        + (f" stderr: {err}" if err else "")
    )
    return Diagnosis(title, detail, [r.id for r in hit])


def _acks(failed: list[_R], everything: list[_R]) -> Diagnosis | None:
    waits = [r for r in failed if _ack_wait(r)]
    if len(waits) < MIN_CHECKS:
        return None
    if any(_received(f) and _ACK_FRAME.search(f) for r in failed for f in r.frames):
        return None  # it acks, at least sometimes: the failures are their own
    if not any(_handled_visibly(r) for r in waits):
        return None  # silent on oddly framed tuples only: a framing problem, not acking
    tuples = sum(_awaited_count(r) for r in waits)
    windows = [w for w in (_waited(r) for r in waits) if w is not None]
    usual = min(windows) if windows else None
    longest = max(windows) if windows else None
    ids = [r.id for r in waits]
    emitted = any(_received(f) and '"emit"' in f for r in waits for f in r.frames)
    does = "It emits, but acks or fails" if emitted else "It acks or fails"
    # Late, not never: a check that waits longer passed after more than the usual wait.
    if usual is not None:
        slow = [r for r in everything if r.status == "passed" and r.duration > usual + 0.5]
        if slow and (longest is None or longest <= usual or max(s.duration for s in slow) < longest):
            s = max(slow, key=lambda r: r.duration)
            detail = (
                f"{_plural(len(waits), 'check')} timed out waiting {_fmt_s(usual)} for an ack/fail and none "
                f"arrived, yet {s.id} (which waits longer) passed after {_fmt_s(s.duration)}: "
                f"answers come, later than the {_fmt_s(usual)} the checks wait (estimated from that "
                f"check's duration; rerun with --timeout {int(s.duration) + 2} to confirm)."
            )
            return Diagnosis(f"answers only after about {_fmt_s(s.duration)}", detail, ids)
    if longest is not None and usual is not None and longest > usual:
        tried = f", not even within {_fmt_s(longest)} (the longest wait of any check)."
    elif usual is not None:
        tried = (f" within {_fmt_s(usual)}; no check waited longer, so a very late answer would look "
                 "the same (rerun with a larger --timeout to tell never from late).")
    else:
        tried = "."
    detail = (
        f"No ack or fail frame was received in any check that sent tuples ({_plural(len(waits), 'check')} "
        f"timed out waiting for one). {does} no tuple{tried} Every tuple must be acked or failed (§3)."
    )
    if any(_syncs_tuples(r) for r in waits):  # a spout answers each command with sync, and takes a tuple for one
        return Diagnosis("this looks like a spout: run with --role spout",
                         "It answers tuples with sync, as a spout answers its commands (§4), and acks none. " + detail,
                         ids)
    return Diagnosis(f"never acks or fails (0 of {_plural(tuples, 'tuple')} answered)", detail, ids)


def _heartbeats(failed: list[_R], everything: list[_R]) -> Diagnosis | None:
    def missed(r: _R) -> bool:
        if r.rule not in ("expect.timeout", "expect.count"):
            return False
        if not _SYNC_PATTERN.search(_waited_for(r.reason)):
            return False
        return any(_is_heartbeat(f) for f in r.frames)

    hit = [r for r in failed if missed(r)]
    if len(hit) < MIN_CHECKS:
        return None
    if any(_received(f) and _SYNC_FRAME.search(f) for r in failed for f in r.frames):
        return None
    sent = sum(f.count(_HEARTBEAT) for r in hit for f in r.frames if _sent(f))
    detail = (
        f"{_plural(len(hit), 'check')} sent heartbeat tuples and no sync came back in any check. "
        "A bolt must answer each heartbeat with {\"command\": \"sync\"} (§3.2, §5.1)."
    )
    return Diagnosis(f"does not answer heartbeats (0 of {_plural(sent, 'heartbeat')} answered with sync)",
                     detail, [r.id for r in hit])


def _settles_twice(failed: list[_R], everything: list[_R]) -> Diagnosis | None:
    hit = [r for r in failed if r.rule == "ids.known" and "that tuple already" in r.reason]
    if not hit:  # one is enough: acking a tuple twice is never right, and the checks it breaks say only "unknown id"
        return None
    verb = "fails" if all("failed that tuple already" in r.reason for r in hit) else "acks"
    detail = (f"{_plural(len(hit), 'check')} saw the component {verb[:-1]} a tuple it had acked or failed already. "
              "Each tuple is acked or failed exactly once (§3.6); a second ack names an id the host no longer knows.")
    return Diagnosis(f"{verb} a tuple twice", detail, [r.id for r in hit])


_RULES: tuple[Callable[[list[_R], list[_R]], Diagnosis | None], ...] = (
    _handshake, _garbage, _settles_twice, _exits, _acks, _heartbeats,
)


def diagnose(results: Iterable[Any]) -> list[Diagnosis]:
    """Return the root causes behind the failures in ``results``, most
    fundamental first; ``[]`` when nothing is wrong. Never raises.

    Accepts :class:`CheckResult` objects or their ``to_json()`` dicts."""
    try:
        everything = [_R(r) for r in (results or []) if r is not None]
    except Exception:  # not iterable, or worse: nothing to say
        return []
    failed = [r for r in everything if r.status == "failed"]
    if not failed:
        return []
    out: list[Diagnosis] = []
    claimed: set[str] = set()
    for rule in _RULES:
        try:
            d = rule([r for r in failed if r.id not in claimed], everything)
        except Exception:  # odd data must not break the report
            continue
        if d is None or not d.checks:
            continue
        out.append(d)
        claimed.update(d.checks)
    return out
