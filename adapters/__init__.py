"""Engines and embeddings (Spark, asyncio). Imported as ``multilang.adapters``.

The engines are submodules, imported by name (``multilang.adapters.spark``,
``multilang.adapters.spark._source.source``, ``multilang.adapters.aio``): each
brings its own dependencies (pyspark, asyncio), so the package imports none.
"""

from multilang import release_stdout

release_stdout()  # a host: its stdout is its own

__all__: list[str] = []
