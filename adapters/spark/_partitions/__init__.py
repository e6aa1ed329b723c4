"""Bolts inside DataFrame (``mapInArrow``) and RDD (``mapPartitions``) jobs."""
