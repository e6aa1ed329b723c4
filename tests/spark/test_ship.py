"""Components shipped to the executors (adapters/spark/_engine/ship.py,
docs/DEPLOY.md): every entry point runs its commands in the unpacked copy
of its folder, on the local master too (one code path); the archive holds
what a command reads (through links) and our libraries, and nothing it
must not (a checkpoint inside the folder, .git); a missing script or
interpreter is one error naming the executor and the command."""

from __future__ import annotations

import os
import socket
import tarfile
import threading
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from multilang.adapters.spark import multilang_bolts, shell_bolt_partition, spark_error_text  # noqa: E402
from multilang.adapters.spark._engine import ship  # noqa: E402
from multilang.errors import TopologyError  # noqa: E402

pytestmark = pytest.mark.spark

#: a bolt that answers each tuple with where it runs and what it reads there
WHERE_BOLT = textwrap.dedent("""\
    import os
    from multilang import BasicBolt

    class Where(BasicBolt):
        def process(self, tup):
            with open(os.path.join("data", "note.txt")) as f:
                self.emit([os.getcwd(), f.read().strip(), os.environ.get("RUBYLIB", "")])

    Where().run()
    """)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    d = tmp_path / "components"
    (d / "data").mkdir(parents=True)
    (d / "where_bolt.py").write_text(WHERE_BOLT)
    (tmp_path / "outside.txt").write_text("read through a link\n")
    (d / "data" / "note.txt").symlink_to(tmp_path / "outside.txt")
    return d


def _ran_in_a_shipped_copy(rows: list, folder: Path) -> None:
    assert rows, "no output"
    for cwd, note, rubylib in rows:
        assert Path(cwd).name.startswith("multilang-components-") and Path(cwd).name.endswith(".tgz"), cwd
        assert Path(cwd) != folder and not Path(cwd).is_relative_to(folder)
        assert note == "read through a link"
        assert rubylib.endswith(os.path.join(Path(cwd).name, ship.LIBS, "ruby"))


def test_a_dataframe_transforms_commands_run_in_the_shipped_copy_of_resource_dir(spark, folder):
    df = spark.createDataFrame([("a",), ("b",)], "x string")
    t = multilang_bolts(["python", "where_bolt.py"], fields=["cwd", "note", "rubylib"], resource_dir=folder)
    _ran_in_a_shipped_copy([tuple(r) for r in df.transform(t).collect()], folder)


def test_an_rdd_functions_commands_run_in_the_shipped_copy_of_resource_dir(spark, folder):
    fn = shell_bolt_partition(["python", "where_bolt.py"], fields=["cwd", "note", "rubylib"], resource_dir=folder)
    _ran_in_a_shipped_copy(spark.sparkContext.parallelize([["a"], ["b"]], 2).mapPartitions(fn).collect(), folder)


@pytest.mark.parametrize("command, problem", [
    (["python", "no_such_bolt.py"], "script 'no_such_bolt.py' not found (commands run in "),
    (["no-such-interpreter", "bolt.x"], "command 'no-such-interpreter' not found on PATH"),
], ids=["script", "interpreter"])
def test_a_missing_script_or_interpreter_is_one_error_naming_the_executor_and_the_command(spark, folder, command,
                                                                                          problem):
    df = spark.createDataFrame([("a",)], "x string")
    with pytest.raises(Exception) as info:
        df.transform(multilang_bolts(command, fields=["y"], resource_dir=folder)).collect()
    text = spark_error_text(info.value)
    assert text.startswith(f"TopologyError: on executor {socket.gethostname()}: bolt "), text
    assert problem in text


def test_the_archive_holds_the_folder_through_links_and_our_libraries_and_leaves_out_checkpoints_and_git(folder):
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref: x\n")
    (folder / "ck").mkdir()
    (folder / "ck" / "state.sqlite").write_text("not shipped")
    path, name = ship.pack(folder, exclude=[str(folder / "ck")])
    with tarfile.open(path) as tar:
        names = set(tar.getnames())
        note = tar.extractfile("data/note.txt").read()
    libs = {f"{ship.LIBS}/ruby/multilang.rb", f"{ship.LIBS}/node/multilang.js"}
    assert {"where_bolt.py", "data/note.txt"} | libs <= names
    assert not any(n.startswith((".git", "ck")) for n in names)
    assert note == b"read through a link\n"
    assert ship.pack(folder, exclude=[str(folder / "ck")]) == (path, name)  # unchanged: packed once
    (folder / "where_bolt.py").write_text(WHERE_BOLT + "# changed\n")
    assert ship.pack(folder, exclude=[str(folder / "ck")])[1] != name  # changed: another archive


def test_a_folder_too_large_to_ship_is_an_error_naming_its_largest_files(folder, monkeypatch):
    (folder / "big.bin").write_bytes(b"\0" * 4096)
    monkeypatch.setattr(ship, "MAX_BYTES", 1024)
    with pytest.raises(TopologyError, match=r"holds 0\.0 MiB, more than the 0\.0 MiB shipped to every executor "
                                            r"\(largest: big\.bin \(0\.0 MiB\)"):
        ship.pack(folder)
    with pytest.raises(TopologyError, match="does not exist"):
        ship.pack(folder / "nowhere")


def test_a_spouts_missing_script_is_one_error_naming_the_host_and_the_command(spark, tmp_path):
    from multilang.adapters.spark import register_source

    register_source(spark)
    df = (spark.readStream.format("multilang").option("command", '["python", "no_such_spout.py"]')
          .option("fields", "line").option("cwd", str(tmp_path)).option("replayLog", str(tmp_path / "replay")).load())
    q = df.writeStream.format("memory").queryName("missing_spout").trigger(availableNow=True).start()
    try:
        with pytest.raises(Exception) as info:  # the query stops with the source's error
            q.awaitTermination(120)
        text = spark_error_text(info.value)
    finally:
        q.stop()
    assert text.startswith(f"TopologyError: on {socket.gethostname()} (the driver, where spouts run): spout "), text
    assert "script 'no_such_spout.py' not found (commands run in " in text


def test_files_that_come_and_go_or_change_size_while_a_folder_is_packed_are_not_an_error(tmp_path):
    # A CI run packed the repository while another test's hypothesis wrote and removed files under
    # .hypothesis/tmp: a file listed by the walk was gone when its bytes were read (FileNotFoundError).
    # Editors' swap files and rotated logs come and go the same way.
    (tmp_path / "bolt.py").write_text("print('hi')\n")
    churn = tmp_path / "churn"
    churn.mkdir()
    stop = threading.Event()

    log = tmp_path / "bolt.log"  # a log rewritten, longer and shorter, while it is packed

    def come_and_go() -> None:
        i = 0
        while not stop.is_set():
            f = churn / f"t{i % 50}"
            f.write_bytes(b"x" * 4096)
            f.unlink()
            log.write_bytes(b"y" * (65536 if i % 2 else 10))
            i += 1

    thread = threading.Thread(target=come_and_go)
    thread.start()
    try:
        for _ in range(300):
            path, _name = ship.pack(tmp_path)
            with tarfile.open(path) as tar:
                assert "bolt.py" in tar.getnames()
                for member in tar.getmembers():  # each whole, as its header says
                    assert len(tar.extractfile(member).read()) == member.size
    finally:
        stop.set()
        thread.join()
