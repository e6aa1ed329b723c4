"""A sample of the malformed topology files of tests/integration/topology_fuzz.py
through ``multilang run`` as a user runs it (real processes; the 2,000-file
fuzz runs in process in tests/unit/test_validation.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from topology_fuzz import check, mutant


def _cli_command() -> list[str]:
    # The module this test imported, run by this interpreter (not a console
    # script that may belong to another installation).
    return [sys.executable, "-c", "from multilang._cli.entry import main; main()"]


def test_fuzz_sample_through_the_real_cli(tmp_path):
    """15 invalid mutants and 1 valid one through ``multilang run`` as a user
    runs it: exit 2, an ``error:`` line, no traceback; every subprocess has a
    timeout, so a hang fails the test instead of stalling it."""
    invalid: list[tuple[int, Path, str]] = []
    valid: list[Path] = []
    seed = 10_000
    while len(invalid) < 15 or not valid:
        p = tmp_path / f"c{seed}.toml"
        p.write_text(mutant(seed))
        msg = check(p)
        if msg is not None and len(invalid) < 15:
            invalid.append((seed, p, msg))
        elif msg is None and not valid:
            valid.append(p)
        seed += 1
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    for seed, p, msg in invalid:
        r = subprocess.run(_cli_command() + ["run", str(p), "--duration", "5", "--no-progress"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (seed, r.returncode, r.stderr[-2000:])
        assert "Traceback" not in r.stderr, (seed, r.stderr[-2000:])
        assert f"error: {msg}" in r.stderr.splitlines(), (seed, msg, r.stderr[-2000:])
    r = subprocess.run(_cli_command() + ["run", str(valid[0]), "--duration", "3", "--no-progress"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=90)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode in (0, 1), (r.returncode, r.stderr[-3000:])
