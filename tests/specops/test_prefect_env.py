"""The temporary Prefect server of a flow command: it sends nothing out, and a SIGTERM to
the command (a worker or an operator cancelling it) stops the server with it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from serving.paths import PROJECT_ROOT
from specops import prefect_env


def test_prepare_prefect_switches_analytics_off_and_keeps_a_callers_handler(monkeypatch):
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "true")
    monkeypatch.setattr(signal, "getsignal", lambda signum: signal.SIG_DFL)
    installed = {}
    monkeypatch.setattr(
        signal, "signal", lambda signum, handler: installed.update({signum: handler})
    )
    prefect_env.prepare_prefect()
    assert os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    assert os.environ["DO_NOT_TRACK"] == "1"
    with pytest.raises(SystemExit) as exited:
        installed[signal.SIGTERM](signal.SIGTERM, None)
    assert exited.value.code == 143
    installed.clear()
    monkeypatch.setattr(signal, "getsignal", lambda signum: print)  # someone else's handler
    prefect_env.prepare_prefect()
    assert installed == {}


@pytest.mark.slow  # its own process and Prefect's temporary server (~30 s on 2 cores)
def test_sigterm_to_a_running_flow_command_stops_its_prefect_server(tmp_path):
    psutil = pytest.importorskip("psutil")
    # An MLflow "server" that accepts and never answers: the collect flow's first registry
    # call connects here and waits, so a connection says the flow is running.
    silent = socket.create_server(("127.0.0.1", 0))
    silent.settimeout(240)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "SPECOPS_"))}
    env |= {
        "PYTHONPATH": str(PROJECT_ROOT),
        "PREFECT_HOME": str(tmp_path / "prefect"),  # its own server database
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "SPECOPS_MLFLOW_URI": f"http://127.0.0.1:{silent.getsockname()[1]}",
    }
    command = subprocess.Popen(
        [sys.executable, "-m", "specops", "loop", "run", "collect",
         "--store", str(tmp_path / "store"), "--work", str(tmp_path / "work")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    servers = []
    try:
        try:
            connection, _ = silent.accept()
        except TimeoutError:
            command.kill()
            pytest.fail(f"the flow never reached the registry: {command.communicate()[0]}")
        servers = [
            p
            for p in psutil.Process(command.pid).children(recursive=True)
            if "prefect.server.api.server:create_app" in " ".join(p.cmdline())
        ]
        assert len(servers) == 1, command.pid
        command.send_signal(signal.SIGTERM)
        output = command.communicate(timeout=60)[0]
        connection.close()
        assert command.returncode == 143, output
        _, alive = psutil.wait_procs(servers, timeout=15)
        assert alive == [], output
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
        silent.close()
        for server in servers:  # a server left by a failure of this test
            if server.is_running():
                server.kill()
