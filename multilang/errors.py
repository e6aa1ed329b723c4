"""The exception hierarchy (DESIGN.md "Errors").

Every error says whose fault it is: ``LocalProtocolError`` means *we* tried to
break the protocol, ``RemoteProtocolError`` means the peer did. Errors a user
can see from the runtime name the component and task and say what to do.
"""

from __future__ import annotations

__all__ = [
    "MultilangError",
    "ProtocolError",
    "LocalProtocolError",
    "RemoteProtocolError",
    "FrameTooLarge",
    "TopologyError",
    "ComponentError",
    "ComponentCrashed",
    "HeartbeatTimeout",
    "ComponentReportedError",
    "last_stderr_line",
]

_EXCERPT = 200
_STDERR_TAIL = "\n  stderr tail:\n"  # (a ComponentError's section of the process's last stderr lines)


def excerpt(data: bytes | str | None, limit: int = _EXCERPT) -> str:
    """A short, printable rendering of offending bytes for error messages."""
    if data is None:
        return ""
    if isinstance(data, str):
        data = data.encode("utf-8", "replace")
    text = repr(bytes(data[:limit]))
    if len(data) > limit:
        text += f"... ({len(data)} bytes)"
    return text


class MultilangError(Exception):
    """Root of every error raised by multilang-bridge."""


class ProtocolError(MultilangError):
    """A multilang protocol rule was broken.

    ``frame`` holds the offending frame (bytes as read or written, or the
    decoded message) when there is one. ``rule`` names the rule that was
    broken, as spec/vectors/README.md "Rules" lists them (``ids.known``,
    ``anchors.known``, ``frame.json``, ...): the conformance runner reports
    it as is, and a caller can tell the rules apart without parsing text.
    """

    #: the rule when the raiser names none: a message out of place (§2-§4)
    default_rule = "protocol.state"

    def __init__(self, msg: str, *, frame: object = None, rule: str | None = None, subject: object = None) -> None:
        self.frame = frame
        self.rule = rule or self.default_rule
        #: what broke the rule, when it is one value (the id of ``ids.known``, ...)
        self.subject = subject
        if frame is not None:
            shown = excerpt(frame) if isinstance(frame, (bytes, bytearray, str)) else repr(frame)[:_EXCERPT]
            msg = f"{msg} (frame: {shown})"
        super().__init__(msg)


class LocalProtocolError(ProtocolError):
    """We (this side of the connection) tried to break the protocol."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol."""


class FrameTooLarge(RemoteProtocolError):
    """The peer sent a frame (or an unterminated line) over the size limit."""

    default_rule = "frame.too-large"


class TopologyError(MultilangError):
    """A topology is invalid; raised when it is built, before anything runs."""


class ComponentError(MultilangError):
    """A component process failed. Carries its identity for the error message."""

    def __init__(
        self,
        msg: str,
        *,
        component: str | None = None,
        task: int | None = None,
        pid: int | None = None,
        stderr_tail: str = "",
        last_frames: tuple[bytes, ...] = (),
    ) -> None:
        self.component = component
        self.task = task
        self.pid = pid
        self.stderr_tail = stderr_tail
        self.last_frames = last_frames
        where = f"component {component!r} task {task}" if component is not None else "component"
        if pid is not None:
            where += f" (pid {pid})"
        text = f"{where}: {msg}"
        if last_frames:
            text += "\n  last frames from it:\n" + "\n".join(f"    {excerpt(f)}" for f in last_frames)
        if stderr_tail:
            text += _STDERR_TAIL + "\n".join(f"    {line}" for line in stderr_tail.splitlines())
        super().__init__(text)


def last_stderr_line(error: BaseException | str) -> str | None:
    """The last line a failed component wrote to its stderr, as a
    :class:`ComponentError`'s text carries it (also once that text crossed
    from a host worker), or None if it has no stderr tail."""
    _, found, tail = str(error).partition(_STDERR_TAIL)
    lines = [line.strip() for line in tail.splitlines() if line.strip()] if found else []
    return lines[-1] if lines else None


class ComponentCrashed(ComponentError):
    """The process exited, closed its stdout, or broke the protocol."""


class HeartbeatTimeout(ComponentError):
    """The process sent nothing within the subprocess timeout."""


class ComponentReportedError(ComponentError):
    """The component sent an ``error`` command (not fatal; reported)."""
