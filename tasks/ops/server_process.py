"""Start ``specops serve`` as a child process on a free loopback port and wait until it
answers; stop it cleanly (SIGTERM: in-flight requests finish, captured records flush).
Used by the load test and by the tests that talk to a real server."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from serving.errors import SpecOpsError
from serving.security.tls import ca_context


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        port: int | None = None,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
        ready_timeout_s: float = 180.0,
        tls_ca: Path | None = None,
    ) -> None:
        """``tls_ca``: the server serves TLS (``args`` give ``--tls-cert`` and ``--tls-key``)
        with a certificate this CA file signed; its url is https and checked with it."""
        self.port = port or free_port()
        # What a client of it verifies it with (httpx's verify=).
        self.verify: ssl.SSLContext | bool = ca_context(tls_ca) if tls_ca is not None else True
        self.url = f"{'https' if tls_ca is not None else 'http'}://127.0.0.1:{self.port}"
        self.args = [*args]
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.ready_timeout_s = ready_timeout_s
        self.process: subprocess.Popen | None = None
        self._log: IO[str] | int | None = None

    def start(self) -> ServerProcess:
        import httpx

        command = [
            sys.executable,
            "-m",
            "specops.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.args,
        ]
        self._log = (
            open(self.log_path, "w") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        )
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=self.env
        )
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SpecOpsError(
                    f"the server exited with code {self.process.returncode} before it was "
                    f"ready; see {self.log_path or 'its output'}"
                )
            try:
                health = httpx.get(f"{self.url}/health", timeout=2.0, verify=self.verify)
                if health.status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise SpecOpsError(f"the server did not answer within {self.ready_timeout_s:g} s")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self, timeout_s: float = 30.0) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if not isinstance(self._log, int | None):
            self._log.close()
        return self.process.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
