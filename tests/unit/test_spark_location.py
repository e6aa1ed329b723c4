"""The checkpoint location of the Spark engine (adapters/spark/_engine/storage.py):
a path or a URI, reached through pyarrow's file systems; files written
whole; a location that cannot be reached is one error naming it."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("pyarrow")

from multilang.adapters.spark._engine.storage import Location  # noqa: E402
from multilang.errors import TopologyError  # noqa: E402


@pytest.mark.parametrize("where, says", [
    ("s4://bucket/ck", "checkpoint location 's4://bucket/ck': "),
    ("hdfs://nowhere:8020/ck", "pyarrow reaches HDFS through libhdfs: set JAVA_HOME"),
], ids=["unknown-scheme", "hdfs-without-libhdfs"])
def test_a_checkpoint_location_that_cannot_be_reached_is_one_error_naming_it(where, says):
    with pytest.raises(TopologyError, match=re.escape(says)):
        Location(where)


def test_a_path_and_a_file_uri_name_the_same_folder_and_a_file_is_written_whole(tmp_path):
    folder = tmp_path / "ck dir"
    by_path, by_uri = Location(str(folder)), Location(f"file://{folder}")
    assert (by_path.is_uri, by_uri.is_uri) == (False, True)
    assert by_path.uri == by_uri.uri == f"file://{folder}"
    by_uri.write(b"one", "a", "f.json")
    by_uri.write(b"two", "a", "f.json")  # replaced, not appended
    assert by_path.read("a", "f.json") == b"two" and by_path.read("a", "nothing") is None
    assert by_path.list("a") == ["f.json"] and not [p for p in (folder / "a").iterdir() if p.suffix == ".tmp"]
