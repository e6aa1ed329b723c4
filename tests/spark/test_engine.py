"""`multilang run --engine spark`: a topology file compiled onto Spark gives the
same output as the local engine (word count through Ruby and Node bolts;
fields, global and all groupings)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import orjson
import pytest
import trio

pytest.importorskip("pyspark")

from multilang.adapters.spark import run_topology  # noqa: E402
from multilang.errors import TopologyError  # noqa: E402
from multilang.shellbolt import Runtime, load_topology  # noqa: E402

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES / "python"))
from split_bolt import words  # noqa: E402


def _python_counts(path: Path) -> list[dict]:
    counts = Counter(w for line in path.read_text(encoding="utf-8").splitlines() for w in words(line.strip()))
    return [{"word": w, "count": n} for w, n in sorted(counts.items())]


def test_cli_spark_engine_on_local_cluster():
    """Two executor JVMs (local-cluster[2,1,1024]): the partition functions are
    pickled to separate executors and the counts stay exact."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    cli = [sys.executable, "-c", "from multilang.cli import main; main()"]
    proc = subprocess.run(cli + ["run", "--engine", "spark", "--master", "local-cluster[2,1,1024]",
                                 str(EXAMPLES / "wordcount.toml")], capture_output=True, env=env, cwd=ROOT,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    got = [orjson.loads(line) for line in proc.stdout.decode().splitlines()]
    assert got == _python_counts(EXAMPLES / "data" / "alice.txt")


GROUPINGS_TOML = """\
[topology]
name = "groupings"

[spouts.sentences]
command = ["python", "{ex}/python/sentence_spout.py", "text.txt"]
fields = ["sentence"]

[bolts.split]
command = ["python", "{ex}/python/split_bolt.py"]
fields = ["word"]
parallelism = 2
inputs = [{{ source = "sentences", grouping = "shuffle" }}]

[bolts.count]
command = ["ruby", "{ex}/ruby/count_bolt.rb"]
fields = ["word", "count"]
parallelism = 3
inputs = [{{ source = "split", grouping = "fields", fields = ["word"] }}]

[bolts.total]
command = ["python", "{ex}/python/count_bolt.py"]
fields = ["word", "count"]
parallelism = 2
inputs = [{{ source = "split", grouping = "global" }}]

[bolts.everywhere]
command = ["node", "{ex}/node/count_bolt.js"]
fields = ["word", "count"]
parallelism = 2
inputs = [{{ source = "split", grouping = "all" }}]
"""


def test_fields_global_all_groupings_match_the_local_engine(spark, tmp_path):
    lines = (EXAMPLES / "data" / "alice.txt").read_text(encoding="utf-8").splitlines()[:60]
    (tmp_path / "text.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    toml = tmp_path / "groupings.toml"
    toml.write_text(GROUPINGS_TOML.format(ex=EXAMPLES))

    local: list[dict] = []
    rt = Runtime(load_topology(toml), on_output=local.append)
    assert trio.run(lambda: rt.run(until_done=True)).ok

    result = run_topology(load_topology(toml), spark=spark)
    key = lambda r: orjson.dumps(r, option=orjson.OPT_SORT_KEYS)  # noqa: E731
    assert Counter(map(key, result.outputs)) == Counter(map(key, local))
    n_words = sum(1 for line in lines for _ in words(line.strip()))
    by_comp = Counter(r["component"] for r in result.outputs)
    assert by_comp == {"count": n_words, "total": n_words, "everywhere": 2 * n_words}
    assert result.counters["everywhere"]["rows_in"] == 2 * n_words
    assert result.ok


def test_direct_grouping_is_rejected(spark, tmp_path):
    toml = tmp_path / "direct.toml"
    toml.write_text(textwrap.dedent(f"""\
        [spouts.s]
        command = ["python", "{EXAMPLES}/python/sentence_spout.py", "x.txt"]
        fields = ["sentence"]
        [bolts.b]
        command = ["python", "{EXAMPLES}/python/split_bolt.py"]
        fields = ["word"]
        inputs = [{{ source = "s", grouping = "direct" }}]
    """))
    with pytest.raises(TopologyError, match="direct groupings"):
        run_topology(load_topology(toml), spark=spark)
