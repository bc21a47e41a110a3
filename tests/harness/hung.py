"""`python -m tests.harness.hung PIDFILE`: what a hung benchmark looks like to `run_module`.

It starts a process in a session of its own (as a peer controller is started), writes that
process's pid to PIDFILE, and then waits for a signal that never comes.
"""

import signal
import subprocess
import sys
from pathlib import Path

child = subprocess.Popen(
    [sys.executable, "-c", "import signal; signal.pause()"], start_new_session=True
)
Path(sys.argv[1]).write_text(str(child.pid))
signal.pause()
