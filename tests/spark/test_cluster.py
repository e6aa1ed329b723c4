"""Spark on a real cluster: a standalone master and two workers on 127.0.0.1
(tests/spark/standalone.py), each worker with its own work directory and
none of them able to see the folder the driver's components are in (an
empty tmpfs over it in the workers' mount namespace). The README word
count via ``multilang run --engine spark --master spark://...`` and a
``multilang_bolts`` streaming job into parquet run there from the copies
shipped to the executors; the streaming job loses a worker (kill -9 of
the worker and its executor) mid-run and its output is still exact."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import warnings
from collections import Counter
from pathlib import Path

import orjson
import pytest

pytest.importorskip("pyspark")

sys.path.insert(0, str(Path(__file__).parent))
import standalone  # noqa: E402

#: one cluster for the module, on one xdist worker, beside the tests of the shared SparkSession
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("cluster")]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
COMPONENTS = Path(__file__).parent / "components"
sys.path.insert(0, str(EXAMPLES / "python"))
from split_bolt import words  # noqa: E402

CLI = [sys.executable, "-c", "from multilang._cli.entry import main; main()"]
ALICE = (EXAMPLES / "data" / "alice.txt").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("standalone")
    c = standalone.start(base, base / "driver-only")
    if not c.isolated:
        warnings.warn("no mount namespace here (unshare): the workers can see the driver's folders, so these "
                      "tests show that the shipped copies work, not that nothing else is needed")
    yield c
    c.stop()


def _hidden_copy(cluster: standalone.Standalone, src: Path, name: str) -> Path:
    dest = cluster.hidden / name
    shutil.copytree(src, dest)
    if cluster.isolated:
        for w in range(len(cluster.workers)):
            assert not cluster.sees(w, dest), f"worker {w} sees {dest}"
    return dest


def test_the_readme_word_count_runs_on_a_cluster_whose_workers_cannot_see_its_folder(cluster, tmp_path):
    topo = _hidden_copy(cluster, EXAMPLES, "examples")
    out = tmp_path / "counts.jsonl"
    # docs/DEPLOY.md's command, with this cluster's master, the hidden copy and a checkpoint of this test
    argv = [str(topo / "wordcount.toml") if a == "examples/wordcount.toml" else cluster.url if a.startswith("spark://")
            else str(tmp_path / "ck") if a.startswith("/tmp/") else a for a in standalone.deploy_commands()["run"]]
    assert argv[:2] == ["multilang", "run"] and cluster.url in argv and str(tmp_path / "ck") in argv
    # and Spark conf as spark-submit takes it: a conf key, and an archive for the executors
    extra = tmp_path / "extra.tgz"
    with tarfile.open(extra, "w:gz") as tar:
        tar.add(__file__, arcname="readme.txt")
    spark_args = ["-c", "spark.app.name=wordcount-on-standalone", "--archives", f"{extra}#extra"]
    r = subprocess.run([*CLI, *argv[1:], *spark_args, "--no-progress", "-o", str(out)],
                       env=standalone.ENV, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:] + cluster.log_text()
    assert "Registering app wordcount-on-standalone" in cluster.logs[0].read_text()
    assert any((d / "extra" / "readme.txt").is_file() for d in cluster.base.glob("worker-*/app-*/*"))
    got = {rec["word"]: rec["count"] for rec in map(orjson.loads, out.read_text().splitlines())}
    assert got == Counter(w for line in ALICE for w in words(line.strip()))  # what the embedded engine prints
    assert "spout tuples sentences: 1080" in r.stderr


def test_a_multilang_bolts_stream_into_parquet_is_exact_after_a_worker_is_killed(cluster, tmp_path):
    comps = _hidden_copy(cluster, EXAMPLES / "ruby", "ruby")
    inputs = tmp_path / "in"
    inputs.mkdir()
    sentences = [(i, s) for i, s in enumerate(line.strip() for line in ALICE) if s]
    n_files = 6
    for k in range(n_files):
        with open(inputs / f"part-{k}.json", "w") as f:
            for i, s in sentences[k::n_files]:
                f.write(json.dumps({"id": i, "sentence": s}) + "\n")
    out, ck = tmp_path / "out", tmp_path / "ck"
    driver = subprocess.Popen([sys.executable, str(COMPONENTS / "cluster_bolts_driver.py"), cluster.url, str(comps),
                               str(inputs), str(out), str(ck)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=standalone.ENV, cwd=tmp_path)
    try:
        seen = []
        for line in driver.stdout:  # the first micro-batch committed: kill a worker under the next
            seen.append(line.strip())
            if line.startswith("batch "):
                cluster.kill_worker(0)
                break
        rest, err = driver.communicate(timeout=240)
    finally:
        driver.kill()
    seen += rest.splitlines()
    assert driver.returncode == 0, err[-3000:] + cluster.log_text()
    assert "batch 0" in seen and "done" in seen
    assert f"batch {n_files - 1}" in seen  # every file's micro-batch ran, the later ones without the worker
    assert "Lost executor" in err  # (Spark's scheduler says so at ERROR: the driver lost the killed worker's)
    rows = orjson.loads(seen[-1])  # what Spark's file sink committed, as the driver read it back
    assert Counter(map(tuple, rows)) == Counter((i, w) for i, s in sentences for w in words(s))
