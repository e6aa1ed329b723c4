"""A correct bolt (the README's Python split bolt) that starts late: it
sleeps the seconds given as its argument before it reads the handshake,
as a JVM or a module with heavy imports does. For test_slow.py."""

import os
import sys
import time
from pathlib import Path

time.sleep(float(sys.argv[1]))
split = Path(__file__).resolve().parents[3] / "examples" / "python" / "split_bolt.py"
os.execv(sys.executable, [sys.executable, str(split)])
