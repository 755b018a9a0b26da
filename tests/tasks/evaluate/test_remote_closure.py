"""The remote path runs on a machine holding only ``REMOTE_PACKAGES`` and what they need.

A fresh interpreter refuses every installed distribution outside that closure (as if it
were not installed, so an optional import behaves as it would there), then imports
the evaluation runner, the evaluation file and the profiler, and runs ``specops profile``
through the CLI's callback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from serving.paths import PROJECT_ROOT
from tasks.evaluate.remote import REMOTE_PACKAGES

pytestmark = pytest.mark.slow  # a fresh interpreter importing torch and transformers

OWN = {"serving", "tasks", "registry", "specops", "flows", "benchmarks"}

# A top-level module of a refused distribution is marked absent: `import` raises
# ModuleNotFoundError and importlib.util.find_spec answers None, as when not installed.
REFUSE = """
import json, os, sys

for name in json.loads(os.environ["REFUSED_MODULES"]):
    sys.modules.setdefault(name, None)
"""


def _closure(names: tuple[str, ...]) -> set[str]:
    """The distributions ``names`` need, installed ones only, extras left out."""
    seen: set[str] = set()
    todo = [canonicalize_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue  # not installed here: nothing of it can be imported anyway
        seen.add(name)
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    return seen


def _refused_modules() -> list[str]:
    allowed = _closure(REMOTE_PACKAGES)
    return sorted(
        module
        for module, dists in packages_distributions().items()
        if module not in OWN and not any(canonicalize_name(d) in allowed for d in dists)
    )


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", REFUSE + code],
        cwd=PROJECT_ROOT,
        env={**os.environ, "REFUSED_MODULES": json.dumps(_refused_modules())},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_closure_refuses_the_mlops_stack():
    refused = set(_refused_modules())
    assert {"mlflow", "prefect", "dvc", "great_expectations", "pydantic_settings"} <= refused
    assert not {"torch", "transformers", "peft", "yaml", "pydantic", "typer"} & refused


def test_the_runner_and_the_profiler_import_within_the_closure():
    done = _run(
        "import tasks.evaluate.remote, tasks.evaluate.evaluation_file\n"
        "import tasks.bench.profile, serving.loader\n"
        "print('imported')\n"
    )
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr[-3000:]


def test_specops_profile_runs_its_callback_within_the_closure():
    # A target off the engine is refused after the callback ran and before any model loads:
    # the CLI and its callback work without the registry's settings.
    done = _run("from specops.cli import app\napp(['profile', '--hardware', 'cpu-vllm'])\n")
    assert "ModuleNotFoundError" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 2, done.stdout + done.stderr[-3000:]
    assert "'vllm' backend" in done.stdout + done.stderr
