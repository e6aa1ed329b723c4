"""Broken bolt: replies with its pid but never creates the pid file (§2.3)."""

from _raw import run_bolt

run_bolt(pid_file=False)
