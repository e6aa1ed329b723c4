"""The results of a conformance run: one ``CheckResult`` per vector, the
``Report`` of the run (levels, warnings, counts, the diagnosis hook) and its
text, JSON and JUnit renderings."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from typing import Any
from xml.etree import ElementTree as ET

from ._diagnosis import diagnose

PASSED = "passed"
FAILED = "failed"
NOT_APPLICABLE = "not-applicable"

# Levels (spec/CONFORMANCE.md "Levels"): how a failed check counts.
REQUIRED = "required"  # what Storm's host and ours rely on: a failure fails the run
RECOMMENDED = "recommended"  # the liberal reading: a failure is a warning unless strict
EXTENSION = "extension"  # an extension the component accepted: a failure fails the run
LEVELS = (REQUIRED, RECOMMENDED, EXTENSION)

#: Rules about what a component writes, broken whatever the vector fed it: a
#: double ack, an id not echoed as sent, a frame that is not JSON... A
#: recommended vector reads the protocol liberally on the *input* side; one
#: of these broken there is a FAIL all the same, never a warning.
REQUIRED_RULES = frozenset({
    "ids.known", "ids.unique", "ids.string-echo", "anchors.known", "frame.json", "frame.invalid", "frame.msgpack",
    "frame.too-large", "values.json", "heartbeat.never-acked", "task-ids.owed", "batch.negotiated",
    "state.negotiated", "state.invalid", "state.order", "handshake.extensions", "handshake.pid-first",
    "spout.emit-anchors",
})


@dataclass
class CheckResult:
    """The outcome of one vector (one check) against one component."""

    id: str
    title: str
    spec: list[str]
    file: str
    status: str
    reason: str = ""
    #: required, recommended or extension (spec/CONFORMANCE.md "Levels").
    level: str = REQUIRED
    #: The rule that was broken (``ids.string-echo``, ``expect.timeout``, ...).
    rule: str = ""
    #: Where it failed: "handshake" (the automatic one), "step N" (1-based,
    #: as in the vector file), or "after the last step".
    step: str = ""
    #: The last frames of the conversation: ``"-> ..."`` sent, ``"<- ..."`` received.
    frames: list[str] = field(default_factory=list)
    stderr: str = ""
    duration: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "spec": self.spec,
            "file": self.file,
            "status": self.status,
            "level": self.level,
            "reason": self.reason,
            "rule": self.rule,
            "step": self.step,
            "frames": self.frames,
            "stderr": self.stderr,
            "duration": round(self.duration, 3),
        }


@dataclass
class Report:
    """Everything one run found out.

    A failed check of level ``recommended`` is a *warning* (it does not fail
    the run) unless ``strict``; required and extension failures always fail it.
    ``CheckResult.status`` stays ``"failed"`` either way: :meth:`is_warning`
    and the counts say how it counts.
    """

    argv: list[str]
    role: str
    mode: str | None  # the scripted component's mode, or None
    lang: str | None
    results: list[CheckResult] = field(default_factory=list)
    duration: float = 0.0
    #: Recommended failures fail the run too (``--strict``).
    strict: bool = False
    #: Checks that passed only when run again with the longer wait (a slow component, ``SLOW_TIMEOUT``).
    slow: list[str] = field(default_factory=list)
    #: The component answered no handshake within 5 s, and did within 30 s: each check waited that long for it.
    slow_start: bool = False

    def is_warning(self, r: CheckResult) -> bool:
        """A failed check that is only reported: a recommended one, not
        strict, and not broken by a rule of :data:`REQUIRED_RULES`."""
        return r.status == FAILED and r.level == RECOMMENDED and not self.strict and r.rule not in REQUIRED_RULES

    @property
    def passed(self) -> int:
        return sum(r.status == PASSED for r in self.results)

    @property
    def failed(self) -> int:
        """Failed checks that fail the run (warnings not counted)."""
        return sum(r.status == FAILED and not self.is_warning(r) for r in self.results)

    @property
    def warnings(self) -> int:
        """Failed recommended checks, when not strict."""
        return sum(self.is_warning(r) for r in self.results)

    @property
    def not_applicable(self) -> int:
        return sum(r.status == NOT_APPLICABLE for r in self.results)

    @property
    def ok(self) -> bool:
        return self.failed == 0

    def ids(self, status: str) -> list[str]:
        return [r.id for r in self.results if r.status == status]

    def warning_ids(self) -> list[str]:
        return [r.id for r in self.results if self.is_warning(r)]

    def __getitem__(self, check_id: str) -> CheckResult:
        for r in self.results:
            if r.id == check_id:
                return r
        raise KeyError(check_id)

    def __contains__(self, check_id: object) -> bool:
        return any(r.id == check_id for r in self.results)

    # -- diagnosis -----------------------------------------------------------

    def diagnosis(self) -> list[Any]:
        """What ``_diagnosis.diagnose`` makes of the results: a list of
        diagnoses (``title``, ``detail``, ``checks``: the ids of the checks
        that failed only as a consequence)."""
        return list(diagnose(self.results))

    @staticmethod
    def _consequences(diagnoses: list[Any]) -> set[str]:
        return {c for d in diagnoses for c in getattr(d, "checks", ())}

    # -- output formats ------------------------------------------------------

    def describe_component(self) -> str:
        if self.mode:
            return f"scripted conformance component, mode {self.mode}, lang {self.lang} (role {self.role})"
        return f"no ready line: protocol checks only (role {self.role})"

    def summary(self) -> str:
        """The closing line: ``N passed, N failed`` (what CI parsers read),
        then ``, N warnings`` if some recommended check failed."""
        line = f"{self.passed} passed, {self.failed} failed"
        if self.warnings:
            line += f", {self.warnings} warning{'s' if self.warnings != 1 else ''}"
        return line

    def to_json(self) -> dict[str, Any]:
        diagnoses = self.diagnosis()
        consequences = self._consequences(diagnoses)
        results = []
        for r in self.results:
            doc = r.to_json()
            doc["warning"] = self.is_warning(r)
            doc["see_diagnosis"] = r.status == FAILED and r.id in consequences
            results.append(doc)
        return {
            "diagnosis": [
                {"title": d.title, "detail": d.detail, "checks": list(d.checks)} for d in diagnoses
            ],
            "argv": self.argv,
            "role": self.role,
            "mode": self.mode,
            "lang": self.lang,
            "strict": self.strict,
            "passed": self.passed,
            "failed": self.failed,
            "warnings": self.warnings,
            "not_applicable": self.not_applicable,
            "slow": self.slow,
            "slow_start": self.slow_start,
            "duration": round(self.duration, 3),
            "results": results,
        }

    def to_text(self, verbose: bool = False) -> str:
        """The report as text: a line per check, its reasons and frames for a
        failure; the not-applicable checks only counted unless ``verbose``
        (as pytest counts its skips)."""
        diagnoses = self.diagnosis()
        consequences = self._consequences(diagnoses)
        # The diagnosis comes first: it names the cause of a cascade of failures.
        lines = [f"diagnosis: {d.title}: {d.detail}" for d in diagnoses]
        lines += [f"multilang conform: {subprocess.list2cmdline(self.argv)}", f"component: {self.describe_component()}"]
        for r in self.results:
            sections = " ".join(f"§{s}" if s[:1].isdigit() else s for s in r.spec)
            if r.status == PASSED:
                slow = "  (slow: passed when run again with the longer wait)" if r.id in self.slow else ""
                lines.append(f"PASS {r.id}  [{sections}] {r.title}{slow}")
            elif r.status == NOT_APPLICABLE:
                if verbose:
                    lines.append(f"N/A  {r.id}  ({r.reason})")
            else:
                tag = "WARN" if self.is_warning(r) else "FAIL"
                see = " (see diagnosis)" if r.id in consequences else ""
                level = f" ({r.level})" if r.level != REQUIRED else ""
                if r.level == RECOMMENDED and r.rule in REQUIRED_RULES:
                    level = f" (a recommended check; rule {r.rule} is required wherever it is broken)"
                lines.append(f"{tag} {r.id}  [{sections}] {r.title}{level}{see}")
                where = f"{r.step}, " if r.step else ""
                lines.append(f"     {where}rule {r.rule}: {r.reason}")
                lines.extend(f"     {f}" for f in r.frames)
                if r.stderr:
                    lines.append("     stderr tail:")
                    lines.extend(f"       {s}" for s in r.stderr.splitlines()[-8:])
        if self.not_applicable:
            lines.append(f"{self.not_applicable} not applicable" + ("" if verbose else " (-v lists them)"))
        if self.slow_start:
            lines.append("the component answered no handshake within 5 s, and did within 30 s (a slow start: a JVM, "
                         "heavy imports): each check waited up to 30 s for its pid reply")
        if self.slow:
            lines.append(f"{len(self.slow)} passed only when run again with a 30 s wait for each frame: the component "
                         "answers more slowly than 2 s (Storm waits topology.message.timeout.secs, 30 s, for an ack)")
        lines.append(self.summary())
        return "\n".join(lines)

    def to_junit(self) -> str:
        suite = ET.Element(
            "testsuite",
            name="multilang-conform",
            tests=str(len(self.results)),
            failures=str(self.failed),
            errors="0",
            skipped=str(self.not_applicable),
            time=f"{self.duration:.3f}",
        )
        props = ET.SubElement(suite, "properties")
        for name, value in (("argv", subprocess.list2cmdline(self.argv)), ("role", self.role),
                            ("mode", self.mode or ""), ("lang", self.lang or ""),
                            ("strict", str(self.strict).lower()), ("warnings", str(self.warnings))):  # fmt: skip
            ET.SubElement(props, "property", name=name, value=value)
        for r in self.results:
            case = ET.SubElement(suite, "testcase", classname=f"conform.{r.file}", name=r.id, time=f"{r.duration:.3f}")
            cprops = ET.SubElement(case, "properties")
            ET.SubElement(cprops, "property", name="level", value=r.level)
            if r.status == FAILED:
                details = [r.title, f"level: {r.level}", f"spec: {', '.join(r.spec)}", f"{r.step}: [{r.rule}] {r.reason}", *r.frames]
                if r.stderr:
                    details += ["stderr tail:", r.stderr]
                if self.is_warning(r):
                    # JUnit has no warnings: a passing case with the finding in its output.
                    ET.SubElement(cprops, "property", name="warning", value=_xml_safe(f"[{r.rule}] {r.reason}"))
                    out = ET.SubElement(case, "system-out")
                    out.text = _xml_safe("WARN (recommended)\n" + "\n".join(details))
                else:
                    fail = ET.SubElement(case, "failure", message=_xml_safe(f"[{r.rule}] {r.reason}"), type=r.rule)
                    fail.text = _xml_safe("\n".join(details))
            elif r.status == NOT_APPLICABLE:
                ET.SubElement(case, "skipped", message=_xml_safe(r.reason))
        root = ET.Element("testsuites", name="multilang-conform", tests=str(len(self.results)),
                          failures=str(self.failed), skipped=str(self.not_applicable))  # fmt: skip
        root.append(suite)
        ET.indent(root)
        return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode")


_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_safe(text: str) -> str:
    return _XML_BAD.sub("\ufffd", text)
