"""Stateful bolts from the command line, as a new user meets them
(README "Stateful bolts", docs/STATE.md, docs/CONF.md): `multilang run
--state-dir`, the conf keys topology.state.checkpoint.interval.ms,
topology.state.provider and topology.state.provider.config in a TOML file, a
component's conf, `-c KEY=VALUE` and a Flux file, and what a user gets when
they are wrong.

The project's rules for user mistakes: a clear error naming the file,
component or key and the cause, exit status 2 for usage and topology errors,
never a Python traceback, never a silent change of meaning. Behaviours that
break them are kept as ``xfail(strict=True)`` tests, each with its reason.

Every run is a `multilang` subprocess over a tiny topology of the examples'
Python components (a few lines of text), with a timeout; runs are synchronised
on files and output, never on sleeps.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
_SCRIPT = Path(sys.executable).parent / "multilang"
ML = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-c", "from multilang._cli.entry import main; main()"]
PY = sys.executable

TEXT = "a b c\nb c\nc\n"
COUNTS = {"a": 1, "b": 2, "c": 3}


# --- helpers ---------------------------------------------------------------------------


def wc_toml(tmp: Path, *, file: str = "wc.toml", name: str = "wc", data: str = "in.txt", conf: str = "",
            spout: str = "sentences", count: str = "count", count_parallelism: int = 1, count_conf: str = "",
            count_cmd: list[str] | None = None, output: str | None = None) -> Path:
    """The README's word count over a tiny text, with Python components:
    spout `spout` -> split -> stateful `count` (examples/python/count_bolt.py),
    output the last tuple per word of `count`."""
    if not (tmp / data).exists():
        (tmp / data).write_text(TEXT)
    count_cmd = count_cmd or [PY, str(EXAMPLES / "python" / "count_bolt.py")]
    if output is None:
        output = f'[output]\ncomponent = "{count}"\nkey = ["word"]\n'
    text = f"""\
[topology]
name = {json.dumps(name)}

[topology.conf]
"topology.max.spout.pending" = 50
{conf}

[spouts.{spout}]
command = {json.dumps([PY, str(EXAMPLES / "python" / "sentence_spout.py"), data])}
fields = ["sentence"]

[bolts.split]
command = {json.dumps([PY, str(EXAMPLES / "python" / "split_bolt.py")])}
fields = ["word"]
inputs = [{{ source = "{spout}", grouping = "shuffle" }}]

[bolts.{count}]
command = {json.dumps(count_cmd)}
fields = ["word", "count"]
parallelism = {count_parallelism}
inputs = [{{ source = "split", grouping = "fields", fields = ["word"] }}]
{count_conf}

{output}
"""
    path = tmp / file
    path.write_text(text)
    return path


def ml(*args: str, cwd: Path, timeout: float = 30, stdin: str | None = None,
       env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*ML, *args], cwd=cwd, input=stdin, capture_output=True, text=True, timeout=timeout,
                          env=env)


def run(toml: Path, *args: str, timeout: float = 30, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return ml("run", toml.name, "--no-progress", *args, cwd=toml.parent, timeout=timeout, env=env)


def counts(stdout: str) -> dict[str, int]:
    return {r["word"]: r["count"] for r in map(json.loads, stdout.splitlines())}


def skipped(stderr: str, spout: str = "sentences") -> int:
    line = next(ln for ln in stderr.splitlines() if ln.startswith(f"[summary]   {spout}:"))
    marker = "skipped (already committed, or in flight from a process that died) "
    return int(line.split(marker, 1)[1]) if marker in line else 0


def committed_txid(db: Path) -> int | None:
    """The last committed checkpoint of a state file no run holds."""
    con = sqlite3.connect(db)
    try:
        row = con.execute("SELECT value FROM meta WHERE key = 'txid'").fetchone()
    finally:
        con.close()
    return int(row[0]) if row else None


def no_traceback(r: subprocess.CompletedProcess) -> bool:
    return "Traceback" not in r.stderr


def usage_error(r: subprocess.CompletedProcess, *parts: str) -> None:
    """Exit 2, no traceback, and every part named in the error."""
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert no_traceback(r), r.stderr[-2000:]
    for part in parts:
        assert part in r.stderr, (part, r.stderr[-2000:])


def _drop_dac() -> list[str]:
    """A prefix that runs a command without root's power to ignore file modes
    (chmod does not bite root): setpriv dropping CAP_DAC_*; [] when not root."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: file modes cannot be made to bite")
    prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    probe = subprocess.run([*prefix, "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"setpriv cannot drop capabilities here: {probe.stderr!r}")
    return prefix


# --- the main path: run, resume, change -----------------------------------------------


def test_a_state_dir_keeps_the_counts_and_a_second_run_resumes_them(tmp_path):
    toml = wc_toml(tmp_path)
    first = run(toml, "--state-dir", "state")
    assert first.returncode == 0 and no_traceback(first), first.stderr
    assert counts(first.stdout) == COUNTS
    assert "kept in state/wc.sqlite" in first.stderr
    assert committed_txid(tmp_path / "state" / "wc.sqlite") >= 1

    again = run(toml, "--state-dir", "state")  # a finished run, run again: the same counts, not doubled
    assert again.returncode == 0, again.stderr
    assert counts(again.stdout) == COUNTS
    assert skipped(again.stderr) == 3


def test_appended_input_lines_are_counted_once_on_top_of_the_kept_state(tmp_path):
    toml = wc_toml(tmp_path)
    assert run(toml, "--state-dir", "state").returncode == 0
    with open(tmp_path / "in.txt", "a") as f:
        f.write("a d\n")
    r = run(toml, "--state-dir", "state")
    assert r.returncode == 0, r.stderr
    assert counts(r.stdout) == {"a": 2, "b": 2, "c": 3, "d": 1}
    assert skipped(r.stderr) == 3


def test_a_state_dir_with_spaces_in_its_path(tmp_path):
    toml = wc_toml(tmp_path)
    state = "my state/x y"
    assert run(toml, "--state-dir", state).returncode == 0
    assert (tmp_path / state / "wc.sqlite").is_file()
    r = run(toml, "--state-dir", state)
    assert r.returncode == 0 and counts(r.stdout) == COUNTS and skipped(r.stderr) == 3, r.stderr


def test_without_a_state_dir_the_temporary_state_is_removed(tmp_path):
    toml = wc_toml(tmp_path)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    r = run(toml, env=dict(os.environ, TMPDIR=str(tmpdir)))
    assert r.returncode == 0 and counts(r.stdout) == COUNTS, r.stderr
    assert "kept for this run only" in r.stderr
    assert not list(tmpdir.glob("multilang-state-*"))


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_state_dir_where_sqlite_cannot_create_a_file_says_so(tmp_path):
    # Before: SQLite's bare "unable to open database file" (root may write almost anywhere; /proc refuses files).
    r = run(wc_toml(tmp_path), "--state-dir", "/proc")
    usage_error(r, "state store /proc/wc.sqlite: unable to open database file: SQLite cannot create or open a file "
                   "there", "give --state-dir a writable directory")


def test_another_parallelism_of_the_stateful_bolt_is_refused(tmp_path):
    assert run(wc_toml(tmp_path), "--state-dir", "state").returncode == 0
    r = run(wc_toml(tmp_path, count_parallelism=2), "--state-dir", "state")
    usage_error(r, "component 'count' has state for 1 task(s), but this topology runs 2", "state/wc.sqlite")


def test_renaming_the_stateful_bolt_is_refused_or_counts_right(tmp_path):
    assert run(wc_toml(tmp_path), "--state-dir", "state").returncode == 0
    with open(tmp_path / "in.txt", "a") as f:
        f.write("a\n")
    r = run(wc_toml(tmp_path, count="counter"), "--state-dir", "state")
    assert no_traceback(r), r.stderr
    refused = r.returncode == 2 and "'count'" in r.stderr
    right = r.returncode == 0 and counts(r.stdout) == {"a": 2, "b": 2, "c": 3}
    assert refused or right, (r.returncode, r.stdout, r.stderr[-1500:])


@pytest.mark.parametrize("how", ["name-collision", "copied-file"])
def test_the_state_file_of_another_topology_is_refused(tmp_path, how):
    (tmp_path / "other.txt").write_text("x y\nz\n")
    other = wc_toml(tmp_path, file="other.toml", name="word count" if how == "name-collision" else "other",
                    data="other.txt", spout="lines", count="counter")
    r = run(other, "--state-dir", "state")
    assert r.returncode == 0 and counts(r.stdout) == {"x": 1, "y": 1, "z": 1}, r.stderr
    if how == "copied-file":
        shutil.copy(tmp_path / "state" / "other.sqlite", tmp_path / "state" / "word_count.sqlite")
    r = run(wc_toml(tmp_path, name="word_count"), "--state-dir", "state")
    assert no_traceback(r), r.stderr
    refused = r.returncode == 2 and "word_count.sqlite" in r.stderr
    assert refused or (r.returncode == 0 and counts(r.stdout) == COUNTS), (r.returncode, r.stdout, r.stderr[-1500:])


# --- Ctrl-C, then the same command again ----------------------------------------------

SLOW_SPOUT = '''\
import os, sys, time
from collections import deque
from multilang import Spout

class Numbered(Spout):
    """Line i is "w<i%5> w<i%5>", message id i. With SLOW_AFTER_ACKS=K it
    touches ACK_MARKER once K trees are acked (acks of trees through a
    stateful bolt come only with a committed checkpoint) and then slows down."""
    def initialize(self, conf, context):
        self.queue = deque(range(int(sys.argv[1])))
        self.acked = 0
        self.slow_after = int(os.environ.get("SLOW_AFTER_ACKS", "-1"))
        self.marker = os.environ.get("ACK_MARKER")

    def next_tuple(self):
        if 0 <= self.slow_after <= self.acked:
            if self.marker and not os.path.exists(self.marker):
                open(self.marker, "w").close()
            time.sleep(0.05)
        if self.queue:
            i = self.queue.popleft()
            self.emit([f"w{i % 5} w{i % 5}"], msg_id=i)

    def ack(self, msg_id):
        self.acked += 1

    def fail(self, msg_id):
        self.queue.append(msg_id)

Numbered().run()
'''


def test_ctrl_c_mid_run_then_the_same_command_resumes_with_exact_counts(tmp_path):
    (tmp_path / "spout.py").write_text(SLOW_SPOUT)
    n = 400
    toml = wc_toml(tmp_path, conf='"topology.state.checkpoint.interval.ms" = 50')
    toml.write_text(toml.read_text().replace(
        json.dumps([PY, str(EXAMPLES / "python" / "sentence_spout.py"), "in.txt"]),
        json.dumps([PY, "spout.py", str(n)])).replace("max.spout.pending\" = 50", "max.spout.pending\" = 20"))
    marker = tmp_path / "acked"
    env = dict(os.environ, SLOW_AFTER_ACKS="100", ACK_MARKER=str(marker))
    first = subprocess.Popen([*ML, "run", toml.name, "--no-progress", "--state-dir", "state"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():  # 100 trees acked: at least one checkpoint committed
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "no 100 trees acked within 30 s"
            time.sleep(0.02)
        os.killpg(first.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group gets SIGINT
        out, err = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.communicate()
    assert first.returncode == 130, err
    assert "interrupted by SIGINT" in err and "Traceback" not in err, err

    second = run(toml, "--state-dir", "state")
    assert second.returncode == 0, second.stderr
    assert counts(second.stdout) == {f"w{k}": 2 * (n // 5) for k in range(5)}
    assert 100 <= skipped(second.stderr) < n


# --- Flux ---------------------------------------------------------------------------------

FLUX = """\
name: "flx"
config:
  multilang.resource.dir: "{examples}"
  multilang.output.component: "count"
  multilang.output.key: ["word"]
  topology.state.checkpoint.interval.ms: {interval}
spouts:
  - id: "s"
    className: "org.apache.storm.flux.wrappers.spouts.FluxShellSpout"
    constructorArgs:
      - ["{py}", "python/sentence_spout.py", "{data}"]
      - ["sentence"]
bolts:
  - id: "split"
    className: "org.apache.storm.flux.wrappers.bolts.FluxShellBolt"
    constructorArgs:
      - ["{py}", "python/split_bolt.py"]
      - ["word"]
  - id: "count"
    className: "org.apache.storm.flux.wrappers.bolts.FluxShellBolt"
    constructorArgs:
      - ["{py}", "python/count_bolt.py"]
      - ["word", "count"]
    configMethods:
      - name: "addComponentConfig"
        args: ["topology.state.provider", "memory"]
streams:
  - from: "s"
    to: "split"
    grouping: {{type: SHUFFLE}}
  - from: "split"
    to: "count"
    grouping: {{type: FIELDS, args: ["word"]}}
"""


def flux(tmp: Path, interval: str = "100") -> Path:
    (tmp / "in.txt").write_text(TEXT)
    path = tmp / "flx.yaml"
    path.write_text(FLUX.format(examples=EXAMPLES, py=PY, data=tmp / "in.txt", interval=interval))
    return path


def test_flux_file_with_a_stateful_bolt_keeps_and_resumes_its_state(tmp_path):
    yaml = flux(tmp_path)
    first = run(yaml, "--state-dir", "state")
    assert first.returncode == 0 and counts(first.stdout) == COUNTS, first.stderr
    # a topology-conf-only key in addComponentConfig: said to have no effect
    assert "bolt 'count': conf key 'topology.state.provider' is read from the topology conf only" in first.stderr
    assert "kept in state/flx.sqlite" in first.stderr
    again = run(yaml, "--state-dir", "state")
    assert again.returncode == 0 and counts(again.stdout) == COUNTS and skipped(again.stderr, "s") == 3


@pytest.mark.parametrize("value, shown", [('"100"', "'100'"), ("0", "0"), ("true", "true (a boolean)"), ("1.5", "1.5")])
def test_flux_checkpoint_interval_of_a_wrong_type_is_refused(tmp_path, value, shown):
    r = run(flux(tmp_path, value))
    usage_error(r, "flx.yaml: conf key 'topology.state.checkpoint.interval.ms' must be an integer from 1 to 86400000 "
                   f"(milliseconds), got {shown}")


# --- conf keys with wrong types and values ----------------------------------------------------

BAD_CONF = [
    ("topology.state.checkpoint.interval.ms", '"abc"', "'abc'"),
    ("topology.state.checkpoint.interval.ms", "0", "0"),
    ("topology.state.checkpoint.interval.ms", "-1", "-1"),
    ("topology.state.checkpoint.interval.ms", "1.5", "1.5"),
    ("topology.state.checkpoint.interval.ms", "true", "true (a boolean)"),
    ("topology.state.checkpoint.interval.ms", '"1000"', "'1000'"),
    ("topology.state.checkpoint.interval.ms", "[1]", "[1] (a list)"),
    ("topology.state.provider", '"redis"', "'redis'"),
    ("topology.state.provider", '"SQLite"', "'SQLite'"),
    ("topology.state.provider", '"a:b:c"', "'a:b:c'"),
    ("topology.state.provider", '"os:"', "'os:'"),
    ("topology.state.provider", '""', "''"),
    ("topology.state.provider", '"org.apache.storm.redis.state.RedisKeyValueStateProvider"',
     "'org.apache.storm.redis.state.RedisKeyValueStateProvider'"),
    ("topology.state.provider", "1", "1"),
    ("topology.state.provider.config", '"not json"', "'not json'"),
    ("topology.state.provider.config", '"[1, 2]"', "'[1, 2]'"),
    ("topology.state.provider.config", "[]", "[] (a list)"),
    ("topology.state.provider.config", "1", "1"),
]
MUST = {"topology.state.checkpoint.interval.ms": "must be an integer from 1 to 86400000 (milliseconds)",
        "topology.state.provider": "must be 'sqlite', 'memory' or a Python 'module:Class'",
        "topology.state.provider.config": 'must be a table or JSON object such as {"dir": "state"}'}


@pytest.mark.parametrize("key, value, shown", BAD_CONF)
def test_a_bad_state_key_in_the_topology_conf_is_refused(tmp_path, key, value, shown):
    r = run(wc_toml(tmp_path, conf=f'"{key}" = {value}'))
    usage_error(r, f"wc.toml: conf key '{key}' {MUST[key]}, got {shown}")


@pytest.mark.parametrize("key, value, shown", BAD_CONF[::3])
def test_a_bad_state_key_in_a_component_conf_is_refused(tmp_path, key, value, shown):
    r = run(wc_toml(tmp_path, count_conf=f'conf = {{ "{key}" = {value} }}'))
    usage_error(r, f"wc.toml: bolt 'count': conf key '{key}' {MUST[key]}, got {shown}")


@pytest.mark.parametrize("key, value, shown", BAD_CONF[1::3])
def test_a_bad_state_key_in_a_conf_override_is_refused(tmp_path, key, value, shown):
    r = run(wc_toml(tmp_path), "-c", f"{key}={value}")
    usage_error(r, f"wc.toml: conf overrides: conf key '{key}' {MUST[key]}, got {shown}")


def test_state_keys_in_a_component_conf_are_said_to_have_no_effect(tmp_path):
    toml = wc_toml(tmp_path, count_conf='conf = { "topology.state.provider" = "memory", '
                                        '"topology.state.checkpoint.interval.ms" = 5, '
                                        '"topology.state.provider.config" = { dir = "compdir" } }')
    r = run(toml)
    assert r.returncode == 0 and counts(r.stdout) == COUNTS, r.stderr
    for key in ("topology.state.provider", "topology.state.checkpoint.interval.ms", "topology.state.provider.config"):
        assert f"wc.toml: bolt 'count': conf key '{key}' is read from the topology conf only" in r.stderr
    assert not (tmp_path / "compdir").exists()


@pytest.mark.parametrize("key, near", [("topology.state.providr", "topology.state.provider"),
                                       ("topology.state.provider.configs", "topology.state.provider.config"),
                                       ("topology_state_provider", "topology.state.provider")])
def test_a_near_miss_of_a_state_key_gets_did_you_mean(tmp_path, key, near):
    r = run(wc_toml(tmp_path), "-c", f"{key}=memory")
    assert r.returncode == 0, r.stderr
    assert f"conf key '{key}' is not one multilang-bridge reads; did you mean '{near}'?" in r.stderr


def test_provider_config_as_json_text_in_the_toml_file(tmp_path):
    toml = wc_toml(tmp_path, conf='"topology.state.provider.config" = \'{"dir": "jstate"}\'')
    r = run(toml)
    assert r.returncode == 0 and counts(r.stdout) == COUNTS, r.stderr
    assert "kept in jstate/wc.sqlite" in r.stderr and (tmp_path / "jstate" / "wc.sqlite").is_file()


def test_provider_memory_keeps_state_for_the_run(tmp_path):
    r = run(wc_toml(tmp_path), "-c", "topology.state.provider=memory")
    assert r.returncode == 0 and counts(r.stdout) == COUNTS, r.stderr
    assert "state of count: checkpoint 1 committed" in r.stderr


def test_provider_config_json_text_null_is_no_settings(tmp_path):
    r = run(wc_toml(tmp_path), "-c", 'topology.state.provider.config="null"')
    assert no_traceback(r), r.stderr[-1500:]
    assert r.returncode == 0 and counts(r.stdout) == COUNTS


def test_a_huge_checkpoint_interval_is_refused_or_runs(tmp_path):
    r = run(wc_toml(tmp_path), "-c", f"topology.state.checkpoint.interval.ms={10 ** 400}")
    assert no_traceback(r), r.stderr[-1500:]
    assert r.returncode in (0, 2)


@pytest.mark.parametrize("config", ['{ dir = 5 }', '{ dir = true }', '{ dir = ["a"] }'])
def test_a_provider_config_dir_that_is_not_a_string_is_refused(tmp_path, config):
    r = run(wc_toml(tmp_path, conf=f'"topology.state.provider.config" = {config}'))
    usage_error(r, "wc.toml", "topology.state.provider.config")


@pytest.mark.parametrize("key", ["directory", "Dir"])
def test_an_unknown_sqlite_provider_setting_is_reported(tmp_path, key):
    r = run(wc_toml(tmp_path, conf=f'"topology.state.provider.config" = {{ {key} = "state" }}'))
    assert no_traceback(r), r.stderr
    assert f"'{key}'" in r.stderr and "dir" in r.stderr.replace(f"'{key}'", ""), r.stderr[-1500:]


def test_a_toml_style_provider_config_on_the_command_line_gets_a_json_example(tmp_path):
    r = run(wc_toml(tmp_path), "-c", "topology.state.provider.config={dir = 'state'}")
    usage_error(r, "conf overrides", "topology.state.provider.config")
    assert '{"dir"' in r.stderr, r.stderr


# --- providers: module:Class ---------------------------------------------------------------

STORES = '''\
from multilang.shellbolt._runtime.state_store import MemoryStore

class Raises:
    def __init__(self, config, topology):
        raise ValueError("cannot reach redis at localhost:6379")

class Echo(MemoryStore):
    def __init__(self, config, topology):
        super().__init__()
        import sys
        print(f"STORE CONFIG {sorted(config.items())!r} {topology!r}", file=sys.stderr)
'''


def stores_env(tmp: Path) -> dict[str, str]:
    (tmp / "pp").mkdir(exist_ok=True)
    (tmp / "pp" / "mystores.py").write_text(STORES)
    return dict(os.environ, PYTHONPATH=str(tmp / "pp"))


def test_a_provider_module_that_does_not_exist_is_refused(tmp_path):
    r = run(wc_toml(tmp_path), "-c", "topology.state.provider=nosuchmodule_xyz:Store")
    usage_error(r, "topology.state.provider 'nosuchmodule_xyz:Store'", "No module named 'nosuchmodule_xyz'")


def test_a_provider_class_that_does_not_exist_is_refused(tmp_path):
    r = run(wc_toml(tmp_path), "-c", "topology.state.provider=mystores:Nope", env=stores_env(tmp_path))
    usage_error(r, "topology.state.provider 'mystores:Nope'", "has no attribute 'Nope'")


def test_a_provider_class_gets_the_config_and_the_topology_name(tmp_path):
    toml = wc_toml(tmp_path, conf='"topology.state.provider" = "mystores:Echo"\n'
                                  '"topology.state.provider.config" = { host = "redis.example" }')
    r = run(toml, env=stores_env(tmp_path))
    assert r.returncode == 0 and counts(r.stdout) == COUNTS, r.stderr
    assert "STORE CONFIG [('host', 'redis.example')] 'wc'" in r.stderr


def test_a_provider_whose_constructor_raises_is_an_error_naming_it(tmp_path):
    r = run(wc_toml(tmp_path), "-c", "topology.state.provider=mystores:Raises", env=stores_env(tmp_path))
    assert no_traceback(r), r.stderr[-1500:]
    assert r.returncode in (1, 2)
    assert "mystores:Raises" in r.stderr and "cannot reach redis at localhost:6379" in r.stderr


def test_state_dir_keeps_the_other_provider_settings(tmp_path):
    toml = wc_toml(tmp_path, conf='"topology.state.provider" = "mystores:Echo"\n'
                                  '"topology.state.provider.config" = { host = "redis.example" }')
    r = run(toml, "--state-dir", "state", env=stores_env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "('host', 'redis.example')" in r.stderr, r.stderr[-1500:]


def test_state_dir_with_the_memory_provider_is_not_silently_ignored(tmp_path):
    r = run(wc_toml(tmp_path), "--state-dir", "state", "-c", "topology.state.provider=memory")
    assert no_traceback(r), r.stderr
    refused = r.returncode == 2 and "--state-dir" in r.stderr
    kept = r.returncode == 0 and (tmp_path / "state").exists()
    assert refused or kept, (r.returncode, r.stderr[-1500:])


# --- the state directory and its file -----------------------------------------------------


def test_a_state_dir_that_is_a_file_is_refused(tmp_path):
    toml = wc_toml(tmp_path)
    (tmp_path / "afile").write_text("x")
    usage_error(run(toml, "--state-dir", "afile"), "--state-dir", "afile", "is a file")
    usage_error(run(toml, "--state-dir", "afile/sub"), "state directory afile/sub: Not a directory")


def test_an_unwritable_state_dir_is_refused(tmp_path):
    prefix = _drop_dac()
    toml = wc_toml(tmp_path)
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o500)
    try:
        r = subprocess.run([*prefix, *ML, "run", toml.name, "--no-progress", "--state-dir", "ro"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=30)
        usage_error(r, "state store ro/wc.sqlite: unable to open database file")
        r = subprocess.run([*prefix, *ML, "run", toml.name, "--no-progress", "--state-dir", "ro/sub"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=30)
        usage_error(r, "state directory ro/sub: Permission denied")
    finally:
        (tmp_path / "ro").chmod(0o700)


def test_a_read_only_state_file_is_refused_or_reported_without_a_traceback(tmp_path):
    prefix = _drop_dac()
    toml = wc_toml(tmp_path)
    assert run(toml, "--state-dir", "state").returncode == 0
    with open(tmp_path / "in.txt", "a") as f:
        f.write("e e\n")  # something new to checkpoint
    db = tmp_path / "state" / "wc.sqlite"
    db.chmod(0o444)
    r = subprocess.run([*prefix, *ML, "run", toml.name, "--no-progress", "--state-dir", "state"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=30)
    assert no_traceback(r), r.stderr[-1500:]
    assert r.returncode in (1, 2) and "state/wc.sqlite" in r.stderr
    assert "task None" not in r.stderr, r.stderr[-1500:]


@pytest.mark.parametrize("kind, why", [("garbage", "file is not a database"),
                                       ("truncated", "database disk image is malformed")])
def test_a_state_file_that_is_not_sqlite_is_refused(tmp_path, kind, why):
    toml = wc_toml(tmp_path)
    assert run(toml, "--state-dir", "good").returncode == 0
    (tmp_path / "state").mkdir()
    db = tmp_path / "state" / "wc.sqlite"
    if kind == "garbage":
        db.write_text("these are my notes, not a database\n" * 10)
    else:
        db.write_bytes((tmp_path / "good" / "wc.sqlite").read_bytes()[:3000])
    before = db.read_bytes()
    usage_error(run(toml, "--state-dir", "state"), f"state store state/wc.sqlite is not a usable SQLite file: {why}")
    assert db.read_bytes() == before


def _tamper(db: Path, kind: str) -> None:
    con = sqlite3.connect(db)
    if kind == "foreign-schema":
        con.execute("CREATE TABLE meta (name TEXT, age INTEGER)")
    elif kind == "bad-txid":
        con.execute("UPDATE meta SET value = 'x' WHERE key = 'txid'")
    else:
        con.execute("UPDATE kv SET value = '{not json'")
        con.execute("UPDATE outputs SET record = '{not json'")
    con.commit()
    con.close()


@pytest.mark.parametrize("kind", ["foreign-schema", "bad-txid", "bad-json"])
def test_a_damaged_or_foreign_sqlite_file_is_refused_without_a_traceback(tmp_path, kind):
    toml = wc_toml(tmp_path)
    if kind == "foreign-schema":
        (tmp_path / "state").mkdir()
    else:
        assert run(toml, "--state-dir", "state").returncode == 0
    _tamper(tmp_path / "state" / "wc.sqlite", kind)
    r = run(toml, "--state-dir", "state")
    assert no_traceback(r), r.stderr[-1500:]
    assert r.returncode == 2 and "state/wc.sqlite" in r.stderr
    assert "[summary]" not in r.stderr, "refused before any process started, not after the run began"


def test_a_damaged_value_is_refused_before_any_component_starts(tmp_path):
    # The store is checked when it is opened: no process is started only to
    # be stopped when its state turns out to be unreadable (issue 32).
    assert run(wc_toml(tmp_path), "--state-dir", "state").returncode == 0
    con = sqlite3.connect(tmp_path / "state" / "wc.sqlite")
    con.execute("UPDATE kv SET value = '{not json' WHERE key = 'b'")  # one value; the outputs stay good
    con.commit()
    con.close()
    started = tmp_path / "count-started"
    count = f'touch "{started}" && exec "{PY}" "{EXAMPLES / "python" / "count_bolt.py"}"'
    r = run(wc_toml(tmp_path, count_cmd=["sh", "-c", count]), "--state-dir", "state")
    assert r.returncode == 2 and "state/wc.sqlite is damaged" in r.stderr, r.stderr[-1500:]
    assert not started.exists(), "the count bolt was started"


def test_an_empty_state_file_is_a_new_store(tmp_path):
    toml = wc_toml(tmp_path)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "wc.sqlite").write_bytes(b"")
    r = run(toml, "--state-dir", "state")
    assert r.returncode == 0 and counts(r.stdout) == COUNTS, r.stderr


def test_an_empty_state_dir_is_refused(tmp_path):
    r = run(wc_toml(tmp_path), "--state-dir", "")
    usage_error(r, "--state-dir")


def test_two_runs_at_once_on_one_state_dir_the_second_is_refused_at_once(tmp_path):
    """The second run is refused while the first holds the store (the first
    prints each word as it is counted: it holds the store by then). At once:
    not when the first ends (it would run for 300 s; the second is given 30),
    and the first is still running when it is stopped (143, not 0)."""
    toml = wc_toml(tmp_path, output='[output]\ncomponent = "count"\n')
    first = subprocess.Popen([*ML, "run", toml.name, "--no-progress", "--state-dir", "state", "--duration", "300"],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        assert first.stdout.readline(), "the first run printed nothing"
        r = run(toml, "--state-dir", "state")
        usage_error(r, "state store state/wc.sqlite: another run is using it")
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.communicate(timeout=30)
    assert first.returncode == 143


def test_state_dir_without_a_stateful_bolt_says_so(tmp_path):
    toml = wc_toml(tmp_path, count_cmd=[PY, str(EXAMPLES / "python" / "split_bolt.py")],
                   output='[output]\ncomponent = "count"\n')
    toml.write_text(toml.read_text().replace('fields = ["word", "count"]', 'fields = ["word"]'))
    r = run(toml, "--state-dir", "state")
    assert r.returncode == 0, r.stderr
    assert "state" in r.stderr.lower(), r.stderr


def test_acking_off_still_checkpoints_the_state_at_the_end(tmp_path):
    r = run(wc_toml(tmp_path), "--state-dir", "state", "-c", "topology.acker.executors=0")
    assert r.returncode == 0 and counts(r.stdout) == COUNTS, r.stderr
    assert "checkpoint None" not in r.stderr, r.stderr
    assert committed_txid(tmp_path / "state" / "wc.sqlite") is not None


# --- other commands and engines -----------------------------------------------------------


def test_state_dir_with_the_spark_engine_is_refused_before_spark_starts(tmp_path):
    r = run(wc_toml(tmp_path), "--engine", "spark", "--state-dir", "state")
    usage_error(r, "--state-dir: on --engine spark the state of stateful bolts is kept in the --checkpoint directory")
    assert not (tmp_path / "state").exists()


@pytest.mark.skipif(importlib.util.find_spec("pyspark") is None, reason="needs pyspark (the spark extra)")
def test_state_conf_with_the_spark_engine_is_refused_like_state_dir(tmp_path):
    r = run(wc_toml(tmp_path), "--engine", "spark", "--master", "bogus://nowhere",
            "-c", 'topology.state.provider.config={"dir": "state"}', timeout=120)
    usage_error(r, "topology.state.provider.config")


def test_spark_only_options_on_the_embedded_engine_are_refused(tmp_path):
    # --master had a default, so a --master without --engine spark ran locally without a word
    for flag, value in [("--master", "local[2]"), ("--remote", "sc://localhost"), ("--checkpoint", "ck")]:
        r = run(wc_toml(tmp_path), flag, value)
        usage_error(r, f"{flag} applies to --engine spark")
        assert r.stdout == ""


def test_pipe_refuses_the_flux_only_conf_keys(tmp_path):
    for key, value in [("multilang.output.key", '["x"]'), ("multilang.output.component", "bolt")]:
        r = ml("pipe", "-c", f"{key}={value}", "--", PY, str(EXAMPLES / "python" / "split_bolt.py"),
               cwd=tmp_path, stdin="a b\n")
        usage_error(r, f"{key}: applies to Flux YAML files (multilang run) only and would be ignored by multilang pipe")


def test_pipe_has_no_state_dir_option(tmp_path):
    r = ml("pipe", "--state-dir", "state", "--", PY, str(EXAMPLES / "python" / "count_bolt.py"),
           cwd=tmp_path, stdin="a\n")
    usage_error(r, "No such option '--state-dir'")


def test_pipe_with_a_stateful_bolt_counts_within_the_run(tmp_path):
    r = ml("pipe", "--", PY, str(EXAMPLES / "python" / "count_bolt.py"), cwd=tmp_path, stdin="a\nb\na\n")
    assert r.returncode == 0, r.stderr
    assert [json.loads(ln) for ln in r.stdout.splitlines()] == [["a", 1], ["b", 1], ["a", 2]]


def test_pipe_refuses_a_kept_state(tmp_path):
    """stdin cannot be read again: a kept state would make the next run skip its first lines as done."""
    for key, value in [("topology.state.provider.config", '{"dir": "state"}'), ("topology.state.provider", "memory")]:
        r = ml("pipe", "-c", f"{key}={value}", "--", PY, str(EXAMPLES / "python" / "count_bolt.py"),
               cwd=tmp_path, stdin="a\nb\n")
        usage_error(r, f"{key}: multilang pipe keeps no state between runs")
    assert not (tmp_path / "state").exists()
