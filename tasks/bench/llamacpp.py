"""llama.cpp as a ``specops bench`` baseline, in its own environment.

llama-cpp-python is compiled from source into ``.venv-llamacpp`` (``bash
scripts/setup_backend.sh llamacpp``; ``$SPECOPS_LLAMACPP_PYTHON`` names another
interpreter). The bench starts :mod:`tasks.bench.llamacpp_runner` there once, as a
long-lived process speaking JSON lines, and sends it the same token ids, budget and EOS ids
as every other method. Without that environment the llama.cpp rows are skipped with the
install command as the reason (:class:`LlamaCppUnavailable`); a runner that fails to start
or dies mid-run is reported with its stderr, and a request that takes too long ends the
process instead of hanging the bench.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.errors import SpecOpsError
from serving.paths import PROJECT_ROOT

ENV_DIR = ".venv-llamacpp"
PYTHON_VARIABLE = "SPECOPS_LLAMACPP_PYTHON"
INSTALL = "bash scripts/setup_backend.sh llamacpp"
BUILD_LOG = f"{ENV_DIR}/log/build.log"
LOAD_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 900.0
STDERR_TAIL = 4000  # characters of the runner's stderr quoted in an error


class LlamaCppUnavailable(SpecOpsError):
    """The llama.cpp environment is missing or cannot load the model; the message says
    why and how to install it. The bench skips its rows with this reason."""


class LlamaCppError(SpecOpsError):
    """The llama.cpp runner failed mid-run; the message carries its stderr."""


def llamacpp_python() -> Path:
    """The interpreter of the llama.cpp environment, or :class:`LlamaCppUnavailable`."""
    override = os.environ.get(PYTHON_VARIABLE)
    path = Path(override) if override else PROJECT_ROOT / ENV_DIR / "bin" / "python"
    if not path.is_file():
        where = f"${PYTHON_VARIABLE}={override}" if override else f"{ENV_DIR}/bin/python"
        raise LlamaCppUnavailable(
            f"the llama.cpp environment is not installed ({where} does not exist); build it "
            f"with `{INSTALL}` (llama-cpp-python compiled from source, about 5 min on 2 cores)"
        )
    return path


@dataclass(frozen=True)
class LlamaCppOutput:
    token_ids: list[int]
    seconds: float
    stop: str


class LlamaCppProcess:
    """One runner process: ``generate`` per request; ``close`` (or ``with``) ends it."""

    def __init__(
        self,
        model: Path,
        *,
        threads: int,
        n_ctx: int,
        prompt_lookup_tokens: tuple[int, ...] = (),
        python: Path | None = None,
        load_timeout_s: float = LOAD_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        python = python or llamacpp_python()
        self.request_timeout_s = request_timeout_s
        command = [
            str(python),
            "-m",
            "tasks.bench.llamacpp_runner",
            "--model",
            str(model),
            "--threads",
            str(threads),
            "--n-ctx",
            str(n_ctx),
        ]
        for k in prompt_lookup_tokens:
            command += ["--prompt-lookup-tokens", str(k)]
        env = {
            **os.environ,
            "PYTHONPATH": str(PROJECT_ROOT),
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
        }
        # A file, not a pipe: it can never fill up and stall the runner; closed in close().
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._buffer = b""
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=PROJECT_ROOT,
            env=env,
            bufsize=0,
        )
        try:
            ready = self._read(load_timeout_s, loading=True)
        except LlamaCppError as error:
            self.close()
            raise LlamaCppUnavailable(str(error)) from None
        if "error" in ready:
            stderr = self._stderr_tail()
            self.close()
            raise LlamaCppUnavailable(
                f"the llama.cpp runner could not load {str(model)!r}: {ready['error']}: "
                f"{ready.get('message')}. If the build failed, its log is {BUILD_LOG}; rebuild "
                f"with `{INSTALL}`.{stderr}"
            )
        self.info: dict[str, Any] = ready

    def generate(
        self,
        prompt: list[int],
        *,
        max_new_tokens: int,
        mode: str = "plain",
        num_pred_tokens: int | None = None,
        eos: list[int] | tuple[int, ...] = (),
    ) -> LlamaCppOutput:
        request = {
            "prompt": list(prompt),
            "max_new_tokens": max_new_tokens,
            "mode": mode,
            "num_pred_tokens": num_pred_tokens,
            "eos": list(eos),
        }
        self._write(request)
        reply = self._read(self.request_timeout_s, loading=False)
        if "error" in reply:
            raise LlamaCppError(f"the llama.cpp runner refused a request: {reply['message']}")
        return LlamaCppOutput(list(reply["token_ids"]), float(reply["seconds"]), reply["stop"])

    def close(self) -> None:
        process = self._process
        if process.poll() is None:
            try:
                assert process.stdin is not None
                process.stdin.write(b'{"quit": true}\n')
                process.stdin.close()
                process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None and not stream.closed:
                stream.close()
        self._stderr.close()

    def __enter__(self) -> LlamaCppProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _write(self, payload: dict[str, Any]) -> None:
        assert self._process.stdin is not None
        try:
            self._process.stdin.write((json.dumps(payload) + "\n").encode())
        except (BrokenPipeError, OSError):
            raise self._died("before a request could be sent") from None

    def _read(self, timeout_s: float, *, loading: bool) -> dict[str, Any]:
        """The next reply line; a death or a timeout becomes :class:`LlamaCppError`."""
        assert self._process.stdout is not None
        fd = self._process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._process.kill()
                self._process.wait()
                what = "load the model" if loading else "answer a request"
                raise LlamaCppError(
                    f"the llama.cpp runner did not {what} within {timeout_s:.0f} s and was "
                    f"stopped.{self._stderr_tail()}"
                )
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise self._died("while loading" if loading else "during a request")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            raise LlamaCppError(
                f"the llama.cpp runner wrote {line[:200]!r}, not a JSON reply.{self._stderr_tail()}"
            ) from None
        if not isinstance(reply, dict):
            raise LlamaCppError(f"the llama.cpp runner wrote {reply!r}, not a JSON object")
        return reply

    def _died(self, when: str) -> LlamaCppError:
        try:
            code = self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            code = self._process.wait()
        hint = ""
        if code == -signal.SIGILL:
            hint = (
                " That is SIGILL: llama.cpp was built for instructions this CPU does not run "
                "(some VMs report AMX without enabling it); rebuild it for a named instruction "
                "set: LLAMACPP_CPU=avx512 (or avx2) bash scripts/setup_backend.sh llamacpp."
            )
        return LlamaCppError(
            f"the llama.cpp runner exited {when} with status {code}.{hint}{self._stderr_tail()}"
        )

    def _stderr_tail(self) -> str:
        try:
            self._stderr.flush()
            self._stderr.seek(0)
            text = self._stderr.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""
        if not text:
            return " It wrote nothing to stderr."
        return f" Its stderr ends:\n{text[-STDERR_TAIL:]}"
