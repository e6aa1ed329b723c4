"""Where this installation keeps the Ruby and Node component libraries.

A wheel carries them as ``multilang/ruby/multilang.rb`` and
``multilang/node/multilang.js`` (pyproject.toml maps examples/ruby and
examples/node there); a checkout (an editable install) has them in
``examples/``. The Python library is this package itself. Read by
``multilang lib`` and by the Spark adapter, which ships them to the
executors beside a topology's components.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["FILES", "library_path"]

#: language -> the library's file name
FILES = {"ruby": "multilang.rb", "node": "multilang.js"}


def library_path(lang: str) -> Path:
    """The file of the ``lang`` library (``"ruby"``, ``"node"``), or for
    ``"python"`` the directory to put on PYTHONPATH; FileNotFoundError if
    this installation lacks it."""
    here = Path(__file__).resolve().parent  # the multilang package folder
    if lang == "python":
        return here.parent
    name = FILES[lang]
    for candidate in (here / lang / name, here.parent / "examples" / lang / name):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"the {lang} library ({name}) is not in this installation ({here})")
