"""Levels (spec/CONFORMANCE.md "Levels"): warnings vs failures, --strict, the
report formats, the diagnosis hook, and the runner's own waits (pid file
grace, nothing written after EOF, --timeout stretching every wait)."""

import json
import sys
import textwrap
from dataclasses import dataclass, field
from xml.etree import ElementTree as ET

import pytest
from click.testing import CliRunner

from conform_support import PY, ROOT
from multilang._cli.main import main
from multilang.conform import FAILED, PASSED, CheckResult, Report, _scale, run_conformance
from multilang.conform import _report as _report_module

BOLT = [PY, str(ROOT / "examples/python/conformance_component.py"), "bolt"]


def invoke(*args):
    return CliRunner().invoke(main, ["conform", *args], catch_exceptions=False)


def _tuple(tid, *values):
    return {"id": tid, "comp": "source", "stream": "default", "task": 1, "tuple": list(values)}


VECTORS = {
    "vectors": [
        {"id": "lv.required-ok", "title": "acked", "spec": ["3.6"], "role": "bolt", "requires": "protocol",
         "level": "required",
         "steps": [{"send": _tuple("1", "ack")}, {"expect": {"command": "ack", "id": "1"}}]},
        {"id": "lv.recommended-bad", "title": "expects a fail, gets an ack", "spec": ["3.6"], "role": "bolt",
         "requires": "protocol", "level": "recommended",
         "steps": [{"send": _tuple("2", "ack")}, {"expect": {"command": "fail", "id": "2"}}]},
    ]
}


@pytest.fixture(scope="module")
def vector_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("level-vectors")
    (d / "lv.json").write_text(json.dumps(VECTORS), encoding="utf-8")
    return d


def test_recommended_failure_is_a_warning(vector_dir):
    res = invoke("--vectors", str(vector_dir), "--", *BOLT)
    assert res.exit_code == 0, res.output
    lines = res.output.rstrip("\n").splitlines()
    assert lines[-1] == "1 passed, 0 failed, 1 warning"
    assert any(line.startswith("WARN lv.recommended-bad") for line in lines)
    assert not any(line.startswith("FAIL") for line in lines)
    assert "rule expect.mismatch" in res.output  # the finding is shown like a failure's


def test_strict_makes_it_fail(vector_dir):
    res = invoke("--strict", "--vectors", str(vector_dir), "--", *BOLT)
    assert res.exit_code == 1, res.output
    lines = res.output.rstrip("\n").splitlines()
    assert lines[-1] == "1 passed, 1 failed"
    assert any(line.startswith("FAIL lv.recommended-bad") for line in lines)


def test_json_and_junit_carry_the_level(vector_dir):
    doc = json.loads(invoke("--format", "json", "--vectors", str(vector_dir), "--", *BOLT).output)
    assert (doc["passed"], doc["failed"], doc["warnings"], doc["strict"]) == (1, 0, 1, False)
    assert isinstance(doc["diagnosis"], list)
    by_id = {r["id"]: r for r in doc["results"]}
    assert by_id["lv.required-ok"]["level"] == "required" and not by_id["lv.required-ok"]["warning"]
    bad = by_id["lv.recommended-bad"]
    assert (bad["level"], bad["status"], bad["warning"]) == ("recommended", "failed", True)

    out = invoke("--format", "junit", "--vectors", str(vector_dir), "--", *BOLT).output
    suite = ET.fromstring(out.encode()).find("testsuite")
    assert suite.get("failures") == "0"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    level = {n: c.find("properties/property[@name='level']").get("value") for n, c in cases.items()}
    assert level == {"lv.required-ok": "required", "lv.recommended-bad": "recommended"}
    assert cases["lv.recommended-bad"].find("failure") is None
    assert "WARN" in cases["lv.recommended-bad"].find("system-out").text

    out = invoke("--strict", "--format", "junit", "--vectors", str(vector_dir), "--", *BOLT).output
    suite = ET.fromstring(out.encode()).find("testsuite")
    assert suite.get("failures") == "1"


# -- the diagnosis hook ----------------------------------------------------------


@dataclass
class _Diagnosis:
    title: str
    detail: str
    checks: list = field(default_factory=list)


def _report():
    results = [
        CheckResult(id="a.root", title="root", spec=["3.6"], file="a", status=FAILED, rule="expect.timeout", reason="r"),
        CheckResult(id="a.consequence", title="cons", spec=["3.6"], file="a", status=FAILED, rule="expect.timeout", reason="r"),
        CheckResult(id="a.fine", title="fine", spec=["3.6"], file="a", status=PASSED),
    ]
    return Report(argv=["x"], role="bolt", mode=None, lang=None, results=results)


def test_diagnosis_comes_first_and_marks_consequences(monkeypatch):
    monkeypatch.setattr(_report_module, "diagnose", lambda results: [
        _Diagnosis("never acks or fails", "0 of 2 tuples answered", ["a.consequence"])])
    report = _report()
    lines = report.to_text().splitlines()
    assert lines[0] == "diagnosis: never acks or fails: 0 of 2 tuples answered"
    assert [line for line in lines if line.startswith("FAIL")] == [
        "FAIL a.root  [§3.6] root", "FAIL a.consequence  [§3.6] cons (see diagnosis)"]
    assert lines[-1] == "1 passed, 2 failed"
    doc = report.to_json()
    assert doc["diagnosis"] == [{"title": "never acks or fails", "detail": "0 of 2 tuples answered",
                                 "checks": ["a.consequence"]}]
    assert [r["see_diagnosis"] for r in doc["results"]] == [False, True, False]


def test_no_diagnosis_gives_no_diagnosis_line(monkeypatch):
    monkeypatch.setattr(_report_module, "diagnose", lambda results: [])
    report = _report()
    assert report.to_text().splitlines()[0].startswith("multilang conform: ")
    assert report.to_json()["diagnosis"] == []


# -- runner waits ------------------------------------------------------------------


def test_no_task_id_reply_is_written_after_eof(tmp_path):
    # The scripted bolt emits asking for task ids; stdin is closed before the
    # runner reads that emit. The automatic reply must not go into the closed pipe.
    vec = {"vectors": [{"id": "t.emit-then-eof", "title": "t", "spec": ["5.4"], "role": "bolt", "requires": "bolt",
                        "level": "required",
                        "steps": [{"send": _tuple("5", "emit", ["w"], None)}, {"close_stdin": True},
                                  {"expect_exit": None, "within_ms": 2000}]}]}
    (tmp_path / "t.json").write_text(json.dumps(vec))
    report = run_conformance(BOLT, vectors_dir=tmp_path, cwd=ROOT)
    assert report["t.emit-then-eof"].status == PASSED, report.to_text()


LATE_PID_FILE = textwrap.dedent("""
    import json, os, sys, time
    buf = ""
    while not buf.endswith("\\nend\\n"):
        buf += sys.stdin.read(1)
    hs = json.loads(buf[: -len("\\nend\\n")])
    sys.stdout.write(json.dumps({"pid": os.getpid()}) + "\\nend\\n"); sys.stdout.flush()
    if sys.argv[1] != "never":
        time.sleep(float(sys.argv[1]))  # the pid file after the reply, as storm.py does
        open(os.path.join(hs["pidDir"], str(os.getpid())), "w").close()
    sys.stdin.read()
""")


@pytest.mark.parametrize("delay,status", [("0.3", PASSED), ("never", FAILED)])
def test_pid_file_is_awaited_after_the_reply(tmp_path, delay, status):
    script = tmp_path / "late_pid_file.py"
    script.write_text(LATE_PID_FILE)
    report = run_conformance([PY, str(script), delay], select="handshake.", timeout=1.0)
    r = report["handshake.pid-file"]
    assert r.status == status and r.level == "recommended", report.to_text()
    # the other handshake vectors need no pid file, only a right one if written
    assert report["handshake.escaped-slashes"].status == PASSED, report.to_text()
    assert report.ok  # at worst a warning


def test_timeout_stretches_every_wait(tmp_path):
    assert _scale(0.5) == _scale(2.0) == 1.0 and _scale(10) == 5.0
    script = tmp_path / "slow_exit.py"
    script.write_text("import sys, time\nsys.path.insert(0, sys.argv[1])\n"
                      "from multilang._component import Bolt\n"
                      "class B(Bolt):\n    def process(self, tup):\n        self.ack(tup)\n"
                      "B().run()\ntime.sleep(2.6)\n")
    argv = [PY, str(script), str(ROOT)]
    slow = run_conformance(argv, select="eof.after-handshake", timeout=2.0)
    assert slow["eof.after-handshake"].rule == "process.exit", slow.to_text()
    stretched = run_conformance(argv, select="eof.after-handshake", timeout=6.0)  # exit waits 3 x 2 s
    assert stretched["eof.after-handshake"].status == PASSED, stretched.to_text()


def test_scripted_component_passes_framing_with_strict():
    res = invoke("--strict", "-k", "framing", "--", *BOLT)
    assert res.exit_code == 0, res.output
    assert "WARN" not in res.output
