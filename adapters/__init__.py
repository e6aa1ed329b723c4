"""Engines and embeddings (Spark, asyncio). Imported as ``multilang.adapters``."""
