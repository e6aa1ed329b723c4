"""Broken bolt: prints a banner to stdout before its pid reply (§2.3)."""

import os

from _raw import run_bolt

os.write(1, b"starting up, please wait...\n")
run_bolt()
