"""``multilang conform``: play the host against a component, run the vectors.

The vectors in ``spec/vectors/*.json`` are data (their format is documented in
``spec/vectors/README.md`` and ``spec/vectors/schema.json``); a wheel carries
them as package data in ``multilang/vectors/``. This module is the public face
of their runner: for each vector it starts a fresh process of the component
command (argv list, no shell) with a private pid directory, drives it through
the vector's steps and checks every frame it writes.

The work is done in private modules with one job each:
``_conform_vectors`` (loading vectors, patterns), ``_conform_process`` (the
runner's own process host), ``_conform_run`` (one vector against one process),
``_conform_report`` (results and their text/JSON/JUnit output) and
``_conform_errors``. This module probes the component, picks the vectors that
apply and runs them (``run_conformance``).
"""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence


# The public names (__all__) are re-exported from the modules that do the work;
# LEVELS, _Matcher and _scale stay importable from here too (tests use them).
from .._state import Role
from ..codec import decode_component_frame, loads
from ..errors import ProtocolError
from ..framing import FrameReader
from ..messages import Pid
from ._diagnosis import syncs_tuples
from ._errors import ConformError, VectorBug, _Failure, _NotApplicable
from ._process import _TIMEOUT, _Process
from ._report import EXTENSION, FAILED, LEVELS, NOT_APPLICABLE, PASSED, RECOMMENDED, REQUIRED, CheckResult, Report
from ._run import _DEFAULT_TIMEOUT, _MIN_HANDSHAKE_WAIT, _READY_WAIT, _SHOW_FRAMES, _encode_frame, _Run, _scale, _show
from ._vectors import DEFAULT_CONF, DEFAULT_CONTEXT, DEFAULT_VECTORS_DIR, Vector, _Matcher, load_vectors

__all__ = [
    "run_conformance",
    "load_vectors",
    "Report",
    "CheckResult",
    "ConformError",
    "DEFAULT_VECTORS_DIR",
    "PASSED",
    "FAILED",
    "NOT_APPLICABLE",
    "REQUIRED",
    "RECOMMENDED",
    "EXTENSION",
]

#: Vectors run at once by default (``--jobs``): each waits mostly on its own
#: process, so a few at a time fill the cores without one starving another.
DEFAULT_JOBS = min(4, 2 * (os.cpu_count() or 1))
#: The wait for a frame when a check that timed out at the default 2 s runs
#: again (no --timeout given): Storm's topology.message.timeout.secs default.
#: storm-starter's asyncSplitsentence.js answers a tuple after about 6 s.
SLOW_TIMEOUT = 30.0
#: The failures a slow component shows: an expected frame not in time, no exit in time at EOF
_LATE_RULES = ("expect.timeout", "process.exit")

#: spec/CONFORMANCE.md "Announcing itself".
READY_RE = re.compile(r"^multilang-conformance ready mode=(bolt|basic|spout|stateful) lang=(\S+)$")


# ---------------------------------------------------------------------------
# The runner
# ---------------------------------------------------------------------------


def _probe(argv: Sequence[str], timeout: float, env, cwd,
           wait: float | None = None) -> tuple[str | None, str | None, bool]:
    """Start the component once: does it answer the handshake within
    ``wait`` (default: the handshake allowance of ``timeout``), and is it a
    scripted conformance component (its ready line)? -> (mode, lang, got_pid)."""
    if wait is None:
        wait = max(timeout, _MIN_HANDSHAKE_WAIT * _scale(timeout))
    proc = _Process(argv, env, cwd)
    try:
        reader = FrameReader()
        bodies: list[bytes] = []
        frame = {"pidDir": proc.pid_dir, "conf": DEFAULT_CONF, "context": DEFAULT_CONTEXT[Role.BOLT]}
        try:
            proc.write(_encode_frame(frame, {}), time.monotonic() + wait)
        except _Failure:
            return None, None, False

        def frame_by(deadline: float) -> bytes | None:
            while not bodies:
                chunk = proc.read(deadline)
                if chunk is _TIMEOUT or not chunk:
                    return None
                try:
                    bodies.extend(reader.feed(chunk))
                except ProtocolError:
                    return None
                if not bodies and time.monotonic() > deadline:  # output without end, and no frame in it
                    return None
            return bodies.pop(0)

        first = frame_by(time.monotonic() + wait)
        if first is None:
            return None, None, False
        try:
            got_pid = type(decode_component_frame(first)) is Pid
        except ProtocolError:
            got_pid = False
        if not got_pid:
            return None, None, True  # it answered (wrongly): the vectors will say how
        second = frame_by(time.monotonic() + _READY_WAIT * _scale(timeout))
        if second is None:
            return None, None, True
        try:
            obj = loads(second)
        except ProtocolError:
            return None, None, True
        if type(obj) is dict and obj.get("command") == "log" and type(obj.get("msg")) is str:
            m = READY_RE.match(obj["msg"])
            if m:
                return m.group(1), m.group(2), True
        return None, None, True
    finally:
        proc.kill()


def _applicable(v: Vector, role: str, mode: str | None) -> str | None:
    """None if ``v`` runs against this component, else why not."""
    if v.role != "any" and v.role != role:
        return f"a {v.role} vector; the component runs as a {role}"
    if v.requires != "protocol" and v.requires != mode:
        return f"needs the scripted conformance component in mode {v.requires}"
    return None


def _run_vector(v: Vector, argv, role: Role, timeout: float, handshake_timeout: float, env, cwd) -> CheckResult:
    result = CheckResult(id=v.id, title=v.title, spec=v.spec, file=v.file, status=PASSED, level=v.level)
    t0 = time.monotonic()
    proc = _Process(argv, env, cwd)
    run = _Run(v, proc, role, timeout, handshake_timeout)
    run.where = ""
    try:
        run.run()
    except _Failure as f:
        result.status, result.rule, result.reason = FAILED, f.rule, f.reason
    except _NotApplicable as na:
        result.status, result.reason = NOT_APPLICABLE, str(na)
    except VectorBug as exc:
        result.status, result.rule, result.reason = FAILED, "vector.error", f"the vector is wrong: {exc}"
    finally:
        proc.kill()
        result.duration = time.monotonic() - t0
    if result.status == FAILED:
        result.step = run.where
        result.frames = [f"{d} {_show(b)}{note}" for d, b, note in run.transcript[-_SHOW_FRAMES:]]
        if len(run.transcript) > _SHOW_FRAMES:
            result.frames.insert(0, f"... {len(run.transcript) - _SHOW_FRAMES} earlier frames")
        result.stderr = proc.stderr_tail()
    return result


def run_conformance(
    argv: Sequence[str],
    role: str | None = None,
    *,
    vectors_dir: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    select: str | None = None,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    strict: bool = False,
    jobs: int | None = None,
) -> Report:
    """Run the conformance vectors against the component command ``argv``.

    ``role`` is ``"bolt"`` or ``"spout"``; ``None`` means: a scripted
    conformance component's ready line decides, else ``"bolt"``. ``timeout``
    bounds each wait for a frame (seconds); above the default 2 s it also
    stretches every other wait in proportion (handshake, ready line, exit,
    pid file). ``None`` (the default): 2 s, and if a required check failed
    only because an expected frame did not come in time, the checks that
    did run again with :data:`SLOW_TIMEOUT` (a slow component, as Storm's
    default timeouts allow; ``Report.slow`` names those that pass then).
    ``select`` keeps only vectors whose id contains it. ``strict`` makes
    failed recommended checks fail the run (``report.ok``). ``jobs``: vectors run at once, each against its own
    process (default :data:`DEFAULT_JOBS`; 1 runs them one after another).
    Raises :class:`ConformError` if the vectors cannot be loaded or the
    command cannot be started.
    """
    if not argv:
        raise ConformError("no component command given")
    if role not in (None, "bolt", "spout"):
        raise ConformError(f"role must be 'bolt' or 'spout', not {role!r}")
    t0 = time.monotonic()
    retry_slow = timeout is None
    timeout = _DEFAULT_TIMEOUT if timeout is None else timeout
    vectors = load_vectors(vectors_dir)
    if select:
        vectors = [v for v in vectors if select in v.id]
    cwd_s = os.fspath(cwd) if cwd is not None else None
    probe_wait = max(timeout, _MIN_HANDSHAKE_WAIT * _scale(timeout))
    mode, lang, answered = _probe(argv, timeout, env, cwd_s)
    slow_start = False
    if not answered and retry_slow:
        # A slow start (a JVM, heavy imports): given Storm's 30 s, as `multilang run` and `pipe` give it
        # (topology.subprocess.timeout.secs), not failed at every check (a trial: 8 s, 43 of 43 failed).
        mode, lang, answered = _probe(argv, timeout, env, cwd_s, wait=SLOW_TIMEOUT)
        slow_start, probe_wait = answered, SLOW_TIMEOUT
    if role is None:
        role = "spout" if mode == "spout" else "bolt"
    report = Report(argv=list(argv), role=role, mode=mode, lang=lang, strict=strict, slow_start=slow_start)
    # A component that never answered the probe gets the short wait, so that a
    # silent command costs --timeout per vector, not the handshake allowance.
    handshake_timeout = probe_wait if answered else timeout
    r = Role(role)
    results: list[CheckResult | None] = []
    todo: list[tuple[int, Vector]] = []
    for v in vectors:
        why = _applicable(v, role, mode)
        if why:
            results.append(CheckResult(id=v.id, title=v.title, spec=v.spec, file=v.file, status=NOT_APPLICABLE,
                                       reason=why, level=v.level))
        else:
            todo.append((len(results), v))
            results.append(None)

    def run_one(v: Vector) -> CheckResult:
        return _run_vector(v, argv, r, timeout, handshake_timeout, env, cwd_s)

    jobs = DEFAULT_JOBS if jobs is None else max(1, jobs)
    if answered and jobs > 1 and len(todo) > 1:
        _run_at_once(todo, run_one, results, jobs)
    else:
        # One after another: a component that answered no probe is tried once more; if
        # that gets no pid reply either, the rest are not run (each would wait as long).
        silent = ""
        for i, v in todo:
            if silent:
                results[i] = CheckResult(id=v.id, title=v.title, spec=v.spec, file=v.file, status=FAILED,
                                         rule="handshake.timeout", step="handshake", reason=silent, level=v.level)
                continue
            results[i] = result = run_one(v)
            if not answered and result.rule == "handshake.timeout":
                silent = (f"not run: the component answered no handshake, neither the probe "
                          f"({probe_wait:g} s) nor {v.id} ({timeout:g} s)"
                          + ("" if retry_slow else "; a component slower to start than --timeout allows: a "
                             "longer --timeout"))
    # A slow component fails a required check by a timeout (it answers no tuple in time), and may
    # not exit at EOF before its last answer; one that only misses an answer a recommended check
    # waits for is not slow, and is not waited for longer.
    rules = {i: result.rule for i, result in enumerate(results) if result is not None}
    timed_out = {i: rules[i] for i, _ in todo if rules.get(i) in _LATE_RULES}
    late = [(i, v) for i, v in todo if i in timed_out]
    late.sort(key=lambda iv: not (iv[1].level == REQUIRED and timed_out[iv[0]] == "expect.timeout"))
    if (retry_slow and answered and late and late[0][1].level == REQUIRED and timed_out[late[0][0]] == "expect.timeout"
            and not syncs_tuples([results[i] for i, _ in late])):  # a spout run as a bolt: it never acks
        report.slow = _run_slow(late, results, argv, r, handshake_timeout, env, cwd_s, jobs)
    report.results.extend(r for r in results if r is not None)
    report.duration = time.monotonic() - t0
    return report


def _run_at_once(todo: list[tuple[int, Vector]], run_one: Any, results: list[CheckResult | None], jobs: int) -> None:
    """``run_one`` of each vector of ``todo``, ``jobs`` at a time, into ``results``."""
    with ThreadPoolExecutor(jobs, thread_name_prefix="conform-vector") as pool:
        try:
            for (i, _), result in zip(todo, pool.map(run_one, [v for _, v in todo])):
                results[i] = result
        except BaseException:  # Ctrl-C: no vector not yet started starts, the running ones are killed
            pool.shutdown(wait=False, cancel_futures=True)
            _Process.kill_all()
            raise


def _run_slow(late: list[tuple[int, Vector]], results: list[CheckResult | None], argv: Sequence[str], role: Role,
              handshake_timeout: float, env: Any, cwd: str | None, jobs: int) -> list[str]:
    """The checks that failed only because a frame did not come within the
    default 2 s, run again with :data:`SLOW_TIMEOUT` (Storm waits
    ``topology.message.timeout.secs``, 30 s, for a tuple's ack): the first
    (a required one) alone, and the others only if it got its frames then
    (a component that does not answer at all costs one long wait, not one
    per check).
    Returns the ids that passed on the second run."""

    def again(v: Vector) -> CheckResult:
        return _run_vector(v, argv, role, SLOW_TIMEOUT, handshake_timeout, env, cwd)

    (i0, v0), rest = late[0], late[1:]
    first = again(v0)
    if first.rule == "expect.timeout":  # (v0 timed out waiting for a frame: see run_conformance)
        for i, _ in late:
            result = results[i]
            assert result is not None
            result.reason += f"; nor within {SLOW_TIMEOUT:g} s when {v0.id} was run again"
        return []
    results[i0] = first
    if jobs > 1:
        _run_at_once(rest, again, results, jobs)
    else:
        for i, v in rest:
            results[i] = again(v)
    return [v.id for i, v in late if results[i].status == PASSED]  # type: ignore[union-attr]


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------
