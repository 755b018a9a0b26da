"""What every ``specops`` command that runs a flow in-process sets before Prefect starts.

Without ``PREFECT_API_URL``, Prefect runs the flow against a temporary server of its own,
a ``uvicorn`` subprocess that it stops at interpreter exit (``atexit``). Two things then
need saying before the first flow:

- The server sends nothing out: its analytics are switched off here, whatever the
  caller's environment (``scripts/env.sh`` does the same for the scripts).
- SIGTERM (a worker or an operator cancelling the command) ends the command as Ctrl-C
  does, through the interpreter's exit, so the server is stopped with it. Python's own
  SIGTERM ends the process at once, without ``atexit``, and would leave the server
  running. Prefect's flow engine catches SIGTERM while a flow runs, then sends it again
  to the handler installed before it: this one.
"""

from __future__ import annotations

import os
import signal
from types import FrameType
from typing import NoReturn

# Prefect's temporary local server takes 12-25 s to start on 2 cores.
STARTUP_TIMEOUT_S = "180"


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> NoReturn:
    raise SystemExit(128 + signum)  # the shell's status for a signal: 143 for SIGTERM


def prepare_prefect() -> None:
    """Set the environment of the temporary Prefect server and stop it on SIGTERM."""
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", STARTUP_TIMEOUT_S)
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ["DO_NOT_TRACK"] = "1"
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # a caller's own handler stays
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
