"""Every fenced ```python and ```sh block of README.md runs, and prints what the README says.

How a block is tested is said by an HTML comment on the line just before its
fence:

=================================  ===========================================
(no marker)                        python: run as a script with this
                                   interpreter; sh: run with bash. cwd = the
                                   repo root, a timeout, exit 0 asserted.
``<!-- snippet: skip (why) -->``   not run; the reason is required. For the
                                   blocks that cannot run inside the tests
                                   (the test suite itself, package installs).
``<!-- snippet: after-setup -->``  an sh block ``./scripts/setup.sh && CMD``:
                                   the tests run after setup, so CMD runs (as
                                   an unmarked block would).
``<!-- snippet: bolt -->``         a Python component: run under ``multilang
                                   pipe`` with a sentence on stdin; its emits
                                   are checked (``BOLT_OUTPUTS``).
``<!-- snippet: spark -->``        a PySpark fragment using ``spark`` and
                                   ``lines_df``: run by
                                   tests/spark/test_readme_spark.py, with the
                                   shared SparkSession.
=================================  ===========================================

Stated outputs are asserted too: a ``print(...)`` line ending in a comment
(``print(values)   # ['the'], ['quick']``) promises those Python literals among
the lines the block prints, and the JSON line quoted after the ``toml`` block
must be among the lines of the main job. The ``toml`` block must be
examples/wordcount.toml without its comments. Blocks in other languages (the
layout tree) are ignored.

This module is also imported by name (``from test_readme import ...``) by the
Spark half, so both halves read the README the same way.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TIMEOUT = 300  # seconds per block; the slowest (the main job) takes a few
SETUP_PREFIX = "./scripts/setup.sh && "
KINDS = {"run", "skip", "after-setup", "bolt", "spark"}
TESTED_LANGS = {"python", "sh"}

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
_MARKER = re.compile(r"^<!--\s*snippet:\s*([\w-]+)\s*(?:\((.*)\))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    kind: str  # "run" when unmarked
    reason: str | None  # the parenthesised text of the marker
    marker: str | None  # the marker line as written

    @property
    def id(self) -> str:
        return f"L{self.line}-{self.lang}-{self.kind}"


def parse_readme(text: str) -> list[Block]:
    """Every fenced block (any language), with the marker of the line before it."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not (lines[i].startswith(fence[0] * len(fence)) and not lines[i].strip(fence[0]).strip()):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"README.md:{start + 1}: fence {fence!r} is never closed")
        i += 1  # the closing fence
        prev = lines[start - 1] if start > 0 else ""
        kind, reason, marker = "run", None, None
        if prev.lstrip().startswith("<!--") and "snippet" in prev:
            marker = prev
            mm = _MARKER.match(prev.strip())
            kind = mm.group(1) if mm else f"malformed marker {prev!r}"
            reason = ((mm.group(2) or "").strip() or None) if mm else None
        blocks.append(Block(start + 1, lang, "\n".join(body) + "\n", kind, reason, marker))
    return blocks


@functools.cache
def blocks() -> list[Block]:
    return parse_readme(README.read_text(encoding="utf-8"))


def blocks_of_kind(*kinds: str) -> list[Block]:
    return [b for b in blocks() if b.lang in TESTED_LANGS and b.kind in kinds]


def _param(bs: list[Block]):
    return pytest.mark.parametrize("block", bs, ids=[b.id for b in bs])


# --- running a block ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Ran:
    what: str
    returncode: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        return (f"{self.what}: exit {self.returncode}\n--- stdout (tail) ---\n{self.stdout[-3000:]}"
                f"\n--- stderr (tail) ---\n{self.stderr[-3000:]}")


def _env() -> dict[str, str]:
    # `python`, `python3` and `multilang` in a block mean this interpreter's installation.
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def run(argv: list[str], what: str, stdin: str | None = None) -> Ran:
    """Run argv in the repo root in its own process group; on timeout kill the group."""
    proc = subprocess.Popen(argv, cwd=ROOT, env=_env(), text=True, start_new_session=True,
                            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(stdin, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(Ran(what, -1, out, err).describe() + f"\n(did not finish within {TIMEOUT} s)")
    return Ran(what, proc.returncode, out, err)


def command_of(block: Block) -> str:
    """The code the tests run for a block (after-setup: what follows the setup)."""
    if block.kind == "after-setup":
        assert block.text.startswith(SETUP_PREFIX), (
            f"README.md:{block.line}: an after-setup block must start with {SETUP_PREFIX!r}")
        return block.text[len(SETUP_PREFIX):]
    return block.text


# Never run inside the tests: these change the machine or run the suite itself.
_UNSAFE = re.compile(r"setup\.sh|pip install|apt-get|apt install|\bpytest\b")


@functools.cache
def run_block(block: Block) -> Ran:
    """Run an unmarked or after-setup block once per test session (cached)."""
    code = command_of(block)
    unsafe = _UNSAFE.search(code)
    assert not unsafe, (f"README.md:{block.line}: not run, it contains {unsafe.group(0)!r}: mark it "
                        f"<!-- snippet: skip (why) --> (or after-setup, for ./scripts/setup.sh && CMD)")
    what = f"README.md:{block.line} ({block.lang})"
    if block.lang == "sh":
        return run(["bash", "-e", "-o", "pipefail", "-c", code], what)
    with tempfile.TemporaryDirectory(prefix="readme-snippet-") as d:
        script = Path(d) / f"readme_line_{block.line}.py"
        script.write_text(code, encoding="utf-8")
        return run([sys.executable, str(script)], what)


# --- stated outputs ----------------------------------------------------------------------------

_PRINT_COMMENT = re.compile(r"^\s*print\(.*\)\s*#\s*(.+?)\s*$")


def stated_outputs(code: str) -> list[object]:
    """Values promised by ``print(...)  # v1, v2`` comments (Python literals)."""
    promised: list[object] = []
    for n, line in enumerate(code.splitlines(), 1):
        m = _PRINT_COMMENT.match(line)
        if m:
            try:
                promised.extend(ast.literal_eval(f"[{m.group(1)}]"))
            except (ValueError, SyntaxError) as e:
                raise AssertionError(f"snippet line {n}: the comment after print() must be the printed value(s) "
                                     f"as Python literals: {m.group(1)!r} ({e})") from None
    return promised


def parsed_lines(stdout: str) -> list[object]:
    """Each printed line as a value (JSON, else a Python literal, else the text)."""
    out: list[object] = []
    for line in stdout.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            try:
                out.append(ast.literal_eval(line))
            except (ValueError, SyntaxError):
                out.append(line)
    return out


def strip_toml_comments(text: str) -> str:
    """TOML text without comment lines, trailing comments, trailing spaces and runs of blank lines."""
    kept: list[str] = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        quote, cut, i = None, len(line), 0
        while i < len(line):
            c = line[i]
            if quote:
                if c == "\\" and quote == '"':
                    i += 2
                    continue
                if c == quote:
                    quote = None
            elif c in "\"'":
                quote = c
            elif c == "#":
                cut = i
                break
            i += 1
        kept.append(line[:cut].rstrip())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip() + "\n"


# --- the tests ---------------------------------------------------------------------------------


def test_readme_has_the_blocks_it_is_known_to_have():
    """The parser sees every fence (a parsing slip would silently test nothing)."""
    text = README.read_text(encoding="utf-8")
    opening = [ln for ln in text.splitlines() if re.match(r"^(```|~~~)\s*(python|sh)\s*$", ln)]
    assert len(opening) == len([b for b in blocks() if b.lang in TESTED_LANGS])
    assert len(blocks_of_kind("run", "after-setup")) >= 3
    assert blocks_of_kind("spark") and blocks_of_kind("bolt")


def test_every_python_and_sh_block_is_run_or_skipped_with_a_reason():
    problems = []
    for b in blocks():
        if b.lang not in TESTED_LANGS:
            if b.marker is not None:
                problems.append(f"README.md:{b.line}: a snippet marker before a ```{b.lang} block, which is not tested")
            continue
        where = f"README.md:{b.line} (```{b.lang})"
        if b.kind not in KINDS:
            problems.append(f"{where}: unknown marker {b.marker!r}; known kinds: {sorted(KINDS)}")
        elif b.kind == "skip" and not b.reason:
            problems.append(f"{where}: `snippet: skip` needs a reason: <!-- snippet: skip (why) -->")
        elif b.kind in ("spark", "bolt") and b.lang != "python":
            problems.append(f"{where}: `snippet: {b.kind}` is for python blocks")
        elif b.kind == "after-setup" and (b.lang != "sh" or not b.text.startswith(SETUP_PREFIX)):
            problems.append(f"{where}: `snippet: after-setup` is for sh blocks starting with {SETUP_PREFIX!r}")
        elif b.kind == "bolt" and not [k for k in BOLT_OUTPUTS if k in b.text]:
            problems.append(f"{where}: a bolt snippet with no expected output in BOLT_OUTPUTS")
    # A marker must sit right before a fence: one left dangling marks nothing.
    lines = README.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines[:-1]):
        if line.lstrip().startswith("<!--") and "snippet" in line and not _FENCE.match(lines[n + 1]):
            problems.append(f"README.md:{n + 1}: snippet marker not followed by a fence: {line!r}")
    assert not problems, "\n".join(problems)


@_param(blocks_of_kind("run", "after-setup"))
def test_block_runs_and_prints_what_it_says(block):
    ran = run_block(block)
    assert ran.returncode == 0, ran.describe()
    if block.lang == "python":
        # A component that gave up, or a run that half failed, logs on stderr even when the
        # script exits 0. (sh blocks run `multilang`, which reports progress on stderr.)
        assert not ran.stderr.strip(), "a README python snippet wrote to stderr\n" + ran.describe()
    promised = stated_outputs(command_of(block)) if block.lang == "python" else []
    printed = parsed_lines(ran.stdout)
    missing = [v for v in promised if v not in printed]
    assert not missing, f"promised in the snippet but not printed: {missing}\n" + ran.describe()


def test_main_job_prints_the_line_the_readme_quotes():
    text = README.read_text(encoding="utf-8")
    m = re.search(r"`multilang run` prints one JSON line per word \(`(\{.*?\})`\)", text)
    assert m, "the README no longer quotes a line of the main job's output"
    quoted = m.group(1)
    json.loads(quoted)  # it is a JSON line
    mains = [b for b in blocks_of_kind("run", "after-setup")
             if b.lang == "sh" and command_of(b).strip() == "multilang run examples/wordcount.toml"]
    assert len(mains) == 1, "the README's main-job command block is gone"
    ran = run_block(mains[0])
    assert ran.returncode == 0, ran.describe()
    assert quoted in ran.stdout.splitlines(), (
        f"README quotes {quoted}; the job printed: "
        f"{[ln for ln in ran.stdout.splitlines() if json.loads(quoted).get('word', '') in ln]}")


# A bolt snippet -> (stdin lines for `multilang pipe`, the emits it must print, in order).
BOLT_OUTPUTS = {
    "class Split(": ("the quick brown fox\n", [["the"], ["quick"], ["brown"], ["fox"]]),
    "class Upper(": ("the quick brown fox\njumps over\n", [["THE QUICK BROWN FOX"], ["JUMPS OVER"]]),
    "class Count(": ("alice\nrabbit\nalice\n", [["alice", 1], ["rabbit", 1], ["alice", 2]]),
}


@_param(blocks_of_kind("bolt"))
def test_bolt_block_runs_as_a_bolt(block, tmp_path):
    (key,) = [k for k in BOLT_OUTPUTS if k in block.text]
    stdin, expected = BOLT_OUTPUTS[key]
    script = tmp_path / f"readme_line_{block.line}.py"
    script.write_text(block.text, encoding="utf-8")
    ran = run(["multilang", "pipe", "--", sys.executable, str(script)], f"README.md:{block.line} (bolt)", stdin)
    assert ran.returncode == 0, ran.describe()
    assert parsed_lines(ran.stdout) == expected, ran.describe()


def test_toml_block_is_examples_wordcount_toml():
    (toml_block,) = [b for b in blocks() if b.lang == "toml"]
    example = (ROOT / "examples" / "wordcount.toml").read_text(encoding="utf-8")
    assert strip_toml_comments(toml_block.text) == strip_toml_comments(example), (
        "README's toml block differs from examples/wordcount.toml (comments aside)")
    assert tomllib.loads(toml_block.text) == tomllib.loads(example)
