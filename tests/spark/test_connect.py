"""Spark Connect: a topology (run_topology, the engine behind `multilang run
--engine spark --remote`) and multilang_bolts run under a local Spark Connect
server, with the same results as the embedded engine and a plain count. The
driver is a subprocess: a Connect session cannot share this process with the
test run's classic SparkSession."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES / "python"))
from split_bolt import words  # noqa: E402


def test_a_topology_and_multilang_bolts_under_spark_connect():
    text = EXAMPLES / "data" / "alice.txt"
    # SPARK_TESTING: the local Connect server takes a free port, not 15002 (another driver may hold that one)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_TESTING": "1"}
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "components" / "engine_connect_driver.py"),
                           str(EXAMPLES / "wordcount.toml"), str(text)], capture_output=True, env=env, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    got = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    plain = Counter(w for line in text.read_text(encoding="utf-8").splitlines() for w in words(line.strip()))
    assert got["topology"] == [{"word": w, "count": n} for w, n in sorted(plain.items())]
    assert got["bolts"] == dict(plain)
    assert got["batches"] >= 1
