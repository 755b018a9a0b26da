"""How the local stack runs its services' commands: this environment's console scripts,
commands that must succeed, Debian packages installed on demand (as root), the environment
the services inherit, and the polls that tell a service is alive and ready."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from serving.errors import SpecOpsError

log = logging.getLogger(__name__)


class StackError(SpecOpsError, RuntimeError):
    """A service of the stack could not be installed, started or reached."""


def console_script(name: str) -> str:
    """A console script of this environment (beside the interpreter), else from PATH."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise StackError(f"{name!r} is not installed in this environment; run scripts/setup.sh")
    return found


def run_command(command: list[str], *, env: dict[str, str] | None = None, what: str) -> str:
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    if done.returncode != 0:
        raise StackError(f"{what} failed ({' '.join(command[:3])} ...): {done.stderr.strip()}")
    return done.stdout


def as_root() -> bool:
    return os.geteuid() == 0


def apt_install(package: str, binary: str) -> None:
    """Install a Debian package when its binary is missing (root only)."""
    if Path(binary).exists():
        return
    if not as_root():
        raise StackError(
            f"{binary} is missing: install Debian's {package!r} package (apt-get install "
            f"{package}), or run this as root to have it installed"
        )
    log.info("installing %s (Debian)", package)
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", package]
    try:
        run_command(install, env=env, what=f"apt-get install {package}")
    except StackError:  # a fresh machine's package lists may be missing or stale
        run_command(["apt-get", "update", "-q"], env=env, what="apt-get update")
        run_command(install, env=env, what=f"apt-get install {package}")


# Settings of another registry that would win over the stack's MLFLOW_TRACKING_URI
# (registry/config.py's order) in the services and the worker the stack starts.
_NOT_INHERITED = ("SPECOPS_MLFLOW_URI", "SPECOPS_MLFLOW_ARTIFACTS", "MLFLOW_REGISTRY_URI")


def inherited_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}


def alive(pid: int) -> bool:
    """Running, and not a zombie: a service this process started and then killed stays a
    zombie until reaped, and must not count as running."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for(check: Callable[[], bool], *, timeout_s: float, what: str, log_file: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.25)
    tail = log_file.read_text()[-2000:] if log_file.is_file() else "(no log)"
    raise StackError(f"{what} did not become ready within {timeout_s:g} s; log {log_file}:\n{tail}")


def http_ok(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False
