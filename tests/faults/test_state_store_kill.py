"""The SQLite state store under a real kill (tests/unit/test_state_store.py
has its other rules): a process that commits checkpoints in a loop is killed
with SIGKILL, and the store, reopened, holds the last whole checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from multilang.shellbolt._runtime.state_store import SqliteStore


def test_a_writer_killed_mid_commit_leaves_the_last_whole_checkpoint(tmp_path):
    """SIGKILL a process that commits checkpoints in a loop (each writes
    n = txid under two tasks): after a reopen, txid and state agree."""
    code = textwrap.dedent(f"""
        import sys
        from multilang.shellbolt._runtime.state_store import Checkpoint, SqliteStore
        s = SqliteStore({str(tmp_path)!r}, "wc")
        txid = first = s.txid or 0
        while True:
            txid += 1
            big = {{f"k{{i}}": txid for i in range(200)}}
            s.commit(Checkpoint(txid, changes={{("c", 0): ({{"n": txid, **big}}, []), ("c", 1): ({{"n": txid}}, [])}},
                                completed=[("s", 0, str(txid))]), {{"c": 2}})
            if txid == first + 3:
                print("ready", flush=True)
    """)
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "ready\n"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        s = SqliteStore(str(tmp_path), "wc")
        txid = s.txid
        assert txid is not None and txid >= 3
        assert s.load("c", 0)["n"] == txid == s.load("c", 1)["n"] and s.load("c", 0)["k199"] == txid
        assert s.completed("s", 0, str(txid)) and not s.completed("s", 0, str(txid + 1))
        s.close()
