"""`multilang conform`: exit codes, the last line, --format json and junit."""

import json
import shutil
import subprocess
import time
from xml.etree import ElementTree as ET

import pytest
from click.testing import CliRunner

from conform_support import BROKEN, PY, ROOT
from multilang._cli.main import main
from multilang.testing import Seen, descendant_pids

BOLT = [PY, str(ROOT / "examples/python/conformance_component.py"), "bolt"]
NUMERIC = [PY, str(BROKEN / "broken_numeric_ack_ids.py")]


def invoke(*args):
    return CliRunner().invoke(main, ["conform", *args], catch_exceptions=False)


def test_pass_exit_0_and_last_line():
    res = invoke("-k", "handshake.pid", "--", *BOLT)
    assert res.exit_code == 0, res.output
    lines = res.output.rstrip("\n").splitlines()
    assert lines[-1] == "2 passed, 0 failed"
    assert any(line.startswith("PASS handshake.pid-file") for line in lines)
    assert "mode bolt, lang python" in res.output


def test_fail_exit_1_names_check_and_rule():
    res = invoke("--timeout", "1", "-k", "bolt.ack-id", "--", *NUMERIC)
    assert res.exit_code == 1, res.output
    assert res.output.rstrip("\n").splitlines()[-1] == "0 passed, 4 failed"
    assert "FAIL bolt.ack-id.small" in res.output
    assert "rule ids.string-echo" in res.output
    assert '<- {"command": "ack", "id": 42}' in res.output  # the frame involved


def test_not_applicable_counted_and_listed_with_verbose_only():
    res = invoke("-k", "tick", "--", PY, str(ROOT / "examples/python/split_bolt.py"))
    assert res.exit_code == 0, res.output
    lines = res.output.rstrip("\n").splitlines()
    assert lines[-1] == "0 passed, 0 failed"
    assert lines[-2] == "4 not applicable (-v lists them)"  # bolt-api.tick, basic.tick, and both again over msgpack
    assert not any(line.startswith("N/A") for line in lines), "hidden by default, as pytest hides skips"
    verbose = invoke("-v", "-k", "tick", "--", PY, str(ROOT / "examples/python/split_bolt.py"))
    lines = verbose.output.rstrip("\n").splitlines()
    assert lines[-2] == "4 not applicable"
    assert any(line.startswith("N/A  bolt-api.tick") for line in lines)


FAULTY = [PY, str(ROOT / "tests/faults/components/faulty_bolt.py")]


def test_a_double_ack_fails_required_even_in_a_recommended_check_and_is_diagnosed():
    res = invoke("-k", "framing.crlf", "--", *FAULTY, "--fault", "double_ack")
    assert res.exit_code == 1, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("diagnosis: acks a tuple twice:"), res.output
    assert any(line.startswith("FAIL framing.crlf ") and "rule ids.known is required wherever it is broken" in line
               for line in lines), res.output
    assert not any(line.startswith("WARN") for line in lines)


def test_a_spout_checked_as_a_bolt_that_syncs_tuples_is_told_to_use_role_spout():
    res = invoke("-k", "bolt.", "--", "node", str(ROOT / "examples/node/sentence_spout.js"),
                 str(ROOT / "examples/data/alice.txt"))
    assert res.exit_code == 1
    assert res.output.splitlines()[0].startswith("diagnosis: this looks like a spout: run with --role spout"), res.output


def test_format_json():
    res = invoke("--format", "json", "--timeout", "1", "-k", "ack-id.small", "--", *NUMERIC)
    assert res.exit_code == 1
    doc = json.loads(res.output)
    assert (doc["passed"], doc["failed"]) == (0, 1)
    (r,) = doc["results"]
    assert r["id"] == "bolt.ack-id.small" and r["status"] == "failed" and r["rule"] == "ids.string-echo"
    assert r["spec"] == ["3.1", "3.6"] and r["frames"] and r["step"] == "step 2"


def test_a_command_that_never_answers_the_handshake_is_not_waited_for_per_check():
    """`conform -- sleep 100`: no pid reply to the probe nor to the first
    check; every other check is reported as not run for that reason, so the
    run takes two waits, not one per check (43 of them, about 2 minutes)."""
    res = invoke("--format", "json", "--timeout", "1", "--", PY, "-c", "import time; time.sleep(60)")
    assert res.exit_code == 1, res.output
    doc = json.loads(res.output)
    failed = [r for r in doc["results"] if r["status"] == "failed"]
    assert len(failed) > 10 and doc["passed"] == 0
    assert all(r["rule"] == "handshake.timeout" for r in failed), failed
    waited = [r for r in failed if not r["reason"].startswith("not run:")]
    assert len(waited) == 1 and waited[0]["duration"] >= 1, waited
    assert f"nor {waited[0]['id']} (1 s)" in failed[-1]["reason"], failed[-1]


def test_format_junit():
    res = invoke("--format", "junit", "--timeout", "1", "-k", "handshake.pid", "--", *NUMERIC)
    assert res.exit_code == 0, res.output
    root = ET.fromstring(res.output.encode())
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    assert {c.get("name") for c in cases} == {"handshake.pid-reply", "handshake.pid-file"}
    assert suite.get("failures") == "0" and suite.get("tests") == "2"

    res = invoke("--format", "junit", "--timeout", "1", "-k", "bolt.ack-id", "--", *NUMERIC)
    assert res.exit_code == 1
    suite = ET.fromstring(res.output.encode()).find("testsuite")
    assert suite.get("failures") == "4"
    # the msgpack.bolt.ack-id.* repeats are skipped: this raw bolt speaks no msgpack
    fails = [c.find("failure") for c in suite.findall("testcase") if c.find("skipped") is None]
    assert len(fails) == 4 and all(f is not None and f.get("type") == "ids.string-echo" for f in fails)


def test_junit_skipped_for_not_applicable():
    res = invoke("--format", "junit", "-k", "spout.activate", "--", *BOLT)
    assert res.exit_code == 0
    suite = ET.fromstring(res.output.encode()).find("testsuite")
    assert all(c.find("skipped") is not None for c in suite.findall("testcase"))
    assert suite.get("skipped") == str(len(suite.findall("testcase")))


@pytest.mark.parametrize(
    "args",
    [
        [],  # no command
        ["--role", "sprout", "--", PY, "x.py"],
        ["--format", "xml", "--", PY, "x.py"],
        ["--timeout", "-1", "--", PY, "x.py"],
        ["-k", "no-such-vector-id", "--", *BOLT],
        ["--", "/nonexistent/command/for/conform"],
        ["--vectors", "/nonexistent/vectors/dir", "--", *BOLT],
    ],
)
def test_usage_errors_exit_2(args):
    res = CliRunner().invoke(main, ["conform", *args])
    assert res.exit_code == 2, res.output


@pytest.mark.parametrize("cmd, message", [
    (["nosuchprog123"], "error: command 'nosuchprog123' not found on PATH"),
    (["{dir}"], "error: command '{dir}' is a directory"),
    ([PY, "no/such/bolt.py"], "error: script 'no/such/bolt.py' not found (commands run in"),
], ids=["not-on-path", "a-directory", "missing-script"])
def test_a_command_that_cannot_run_is_one_error_line_before_any_check(cmd, message, tmp_path):
    # Before: click's usage block with a raw "[Errno 2]" (a directory read as "No such file"), or,
    # for a missing script, 52 checks run and exit 1.
    cmd = [c.format(dir=tmp_path) for c in cmd]
    res = CliRunner().invoke(main, ["conform", "--", *cmd])
    assert res.exit_code == 2, res.output
    assert res.output.startswith(message.format(dir=tmp_path)) and "Usage:" not in res.output, res.output


def test_bad_vector_file_is_a_usage_error(tmp_path):
    (tmp_path / "bad.json").write_text('{"vectors": [{"id": "x.y"}]}')
    res = CliRunner().invoke(main, ["conform", "--vectors", str(tmp_path), "--", *BOLT])
    assert res.exit_code == 2
    assert "missing 'title'" in res.output


def test_custom_vector_directory(tmp_path):
    vec = {
        "vectors": [
            {"id": "custom.echo", "title": "t", "spec": ["3.5"], "role": "bolt", "requires": "bolt",
             "steps": [{"send": {"id": "1", "comp": "c", "stream": "default", "task": 1, "tuple": ["echo", "x/y"]},
                        "escape_slashes": True},
                       {"expect": {"command": "emit", "tuple": ["echo", "x/y"], "anchors": ["1"]}},
                       {"expect": {"command": "ack", "id": "$same-as-sent-id"}}]},
            {"id": "custom.wrong", "title": "t", "spec": ["3.6"], "role": "bolt", "requires": "protocol",
             "steps": [{"send": {"id": "2", "comp": "c", "stream": "default", "task": 1, "tuple": ["ack"]}},
                       {"expect": {"command": "fail", "id": "2"}}]},
        ]
    }
    (tmp_path / "custom.json").write_text(json.dumps(vec))
    res = invoke("--vectors", str(tmp_path), "--", *BOLT)
    assert res.exit_code == 1
    assert res.output.rstrip("\n").splitlines()[-1] == "1 passed, 1 failed"
    assert "rule expect.mismatch" in res.output and "$.command" in res.output


@pytest.mark.skipif(shutil.which("multilang") is None, reason="the multilang script is not installed")
def test_installed_entry_point():
    proc = subprocess.run(
        ["multilang", "conform", "--format", "json", "-k", "eof.after-handshake", "--", *BOLT],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["passed"] == 1


ML = shutil.which("multilang")


def test_a_component_that_writes_without_end_gets_a_verdict_within_bounded_memory():
    # `yes` writes "y" lines for ever, never a frame: each check ends at the
    # frame limit or its timeout, whichever comes first, and memory stays
    # bounded by the frame limit (issue 32: no verdict after 200 s, 650 MB).
    proc = subprocess.Popen([ML, "conform", "-k", "bolt.tuple-acked", "--", "yes"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    peak = 0
    hang = time.monotonic() + 300  # a guard against a hang (before the fix: no verdict after 200 s), not a speed check
    while proc.poll() is None:
        if time.monotonic() > hang:
            proc.kill()
            pytest.fail("no verdict")
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                peak = max(peak, next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")))
        except (OSError, StopIteration):
            pass
        try:
            proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            pass
    out = proc.stdout.read()
    assert proc.returncode == 1, out + proc.stderr.read()
    assert "FAIL bolt.tuple-acked-or-failed" in out
    assert "rule frame.too-large" in out or "rule handshake.timeout" in out, out
    assert peak < 64 * 1024 + 200 * 1024, f"peak RSS {peak} KiB: more than the 64 MiB frame limit and the runner"


def test_ctrl_c_stops_conform_at_once_and_kills_every_component_process():
    proc = subprocess.Popen([ML, "conform", "--", "yes"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def yes_running():
            for p in descendant_pids(proc.pid):
                try:
                    if open(f"/proc/{p}/comm").read().strip() == "yes":
                        return True
                except OSError:
                    pass
            return False

        while not yes_running():  # a component process writes: the vectors are under way
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.01)
        children = Seen(descendant_pids(proc.pid))
        proc.send_signal(2)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not children.running(), "a component process outlived conform"
