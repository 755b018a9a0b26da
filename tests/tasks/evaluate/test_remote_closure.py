"""The remote path runs on a machine holding only ``REMOTE_PACKAGES`` and what they need.

A temporary environment, built once per session, holds exactly the lock's lines for
``REMOTE_PACKAGES`` and their dependency closure (uv links them from its cache, filled when
the main environment was built: about a second) and reaches the repository's code through
``PYTHONPATH`` only. Its interpreter imports the evaluation runner, the evaluation file and
the profiler, runs ``python -m specops profile`` and evaluates a bundle with ``python -m
tasks.evaluate.remote`` on the tiny target: what the main environment alone holds (MLflow,
Prefect, DVC, Great Expectations, registry settings) is not there to be imported.

An environment that cannot be built (no uv, no lock for this Python, a package neither
cached nor downloadable) fails these tests with uv's message: the check never skips.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from serving.paths import PROJECT_ROOT
from tasks.evaluate.evaluation_file import read_evaluation_file
from tasks.evaluate.remote import REMOTE_PACKAGES
from tasks.gpu.kit import closure
from tests.tasks.evaluate.bundles import pld_bundle

pytestmark = pytest.mark.slow  # fresh interpreters importing torch and transformers

MLOPS = ("mlflow", "prefect", "dvc", "great_expectations", "pydantic_settings")
LOCK = PROJECT_ROOT / "requirements" / "lock-py{}{}.txt".format(*sys.version_info[:2])
UV = str(Path(sys.executable).parent / "uv")  # the lock pins it
PINNED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def _closure_lines() -> list[str]:
    """The lock's ``name==version`` lines for the closure of ``REMOTE_PACKAGES``."""
    if not LOCK.is_file():
        pytest.fail(f"no lock for Python {sys.version_info[:2]}: {LOCK} is missing")
    pinned = {
        canonicalize_name(match[1]): match[0]
        for match in map(PINNED.match, LOCK.read_text().splitlines())
        if match
    }
    names = set(closure(REMOTE_PACKAGES))
    absent = sorted({canonicalize_name(n) for n in REMOTE_PACKAGES} - names)
    if absent:
        pytest.fail(f"REMOTE_PACKAGES names {absent}, not installed here: run scripts/setup.sh")
    unpinned = sorted(names - pinned.keys())
    if unpinned:
        pytest.fail(f"{LOCK.name} pins no version of {unpinned}, which REMOTE_PACKAGES need")
    return [pinned[name] for name in sorted(names)]


def _torch_sources(lines: list[str]) -> list[str]:
    """Where a CPU build of torch comes from, as scripts/setup.sh finds it."""
    if not any(line.startswith("torch==") and line.endswith("+cpu") for line in lines):
        return []
    links = os.environ.get("SPECOPS_TORCH_FIND_LINKS")
    if not links:
        links = "/opt/wheels" if Path("/opt/wheels").is_dir() else None
    return ["--find-links", links or "https://download.pytorch.org/whl/cpu/torch/"]


def _uv(*args: str, cwd: Path) -> None:
    done = subprocess.run(
        [UV, *args],
        cwd=cwd,
        env={**os.environ, "UV_SYSTEM_CERTS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        pytest.fail(
            f"cannot build the remote path's environment (`uv {' '.join(args[:2])}` exited "
            f"{done.returncode}); build the main environment first (scripts/setup.sh), which "
            f"fills uv's cache:\n{done.stderr[-3000:]}"
        )


@pytest.fixture(scope="session")
def remote_env(tmp_path_factory) -> tuple[Path, list[str]]:
    """A virtual environment holding exactly the closure's lock lines; its folder and them."""
    if not Path(UV).is_file():
        pytest.fail(f"no uv beside {sys.executable}: the lock pins it, run scripts/setup.sh")
    folder = tmp_path_factory.mktemp("remote-env")
    env, requirements = folder / "venv", folder / "requirements.txt"
    lines = _closure_lines()
    requirements.write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    _uv("venv", "--quiet", "--no-project", "--python", sys.executable, str(env), cwd=folder)
    # Hard links into uv's cache (uv copies instead where the cache is on another file
    # system): nothing here writes into an installed file, only new __pycache__ entries.
    _uv(
        "pip", "sync", "--quiet", "--python", str(env / "bin" / "python"),
        "--link-mode", "hardlink", *_torch_sources(lines), str(requirements), cwd=folder,
    )  # fmt: skip
    print(f"remote path environment: {len(lines)} packages in {time.monotonic() - started:.1f} s")
    return env, lines


def _run(env: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    """``env``'s interpreter with ``args``, the repository reached through PYTHONPATH only."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}
    }
    return subprocess.run(
        [str(env / "bin" / "python"), *args],
        cwd=PROJECT_ROOT,
        env={**environ, "PYTHONPATH": str(PROJECT_ROOT), "PYTHONNOUSERSITE": "1", **extra},
        capture_output=True,
        text=True,
        timeout=300,
    )


# Where each entry of sys.path and each imported module lies: the environment, the
# interpreter's standard library, or the repository (the main environment, even when it is
# a folder of the repository, counts as outside).
ORIGINS = """
import json, os, sys, sysconfig

env = os.path.realpath(sys.prefix)
stdlib = os.path.realpath(sysconfig.get_paths(vars={"base": sys.base_prefix})["stdlib"])
zipped = os.path.join(os.path.dirname(stdlib), "python%d%d.zip" % sys.version_info[:2])
root, main_env = map(os.path.realpath, json.loads(os.environ["ORIGIN_ROOTS"]))

def outside(path):
    path = os.path.realpath(path)
    if path == env or path.startswith(env + os.sep):
        return False
    if path == zipped or path.startswith(stdlib) and "-packages" not in path:
        return False
    return path == main_env or path.startswith(main_env + os.sep) or not (
        path == root or path.startswith(root + os.sep)
    )

files = [getattr(m, "__file__", None) for m in list(sys.modules.values())]
print(json.dumps({
    "path": [p for p in sys.path if p and outside(p)],
    "modules": sorted(f for f in files if f and outside(f)),
}))
"""


def test_the_closure_refuses_the_mlops_stack(remote_env):
    env, lines = remote_env
    frozen = subprocess.run(
        [UV, "pip", "freeze", "--python", str(env / "bin" / "python")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert sorted(frozen) == sorted(lines)  # exactly the lock's lines, nothing more
    code = "import importlib.util as u\nprint(sorted(m for m in {!r} if u.find_spec(m)))"
    done = _run(env, "-c", code.format(MLOPS))
    assert done.stdout.strip() == "[]", done.stderr[-3000:]
    done = _run(env, "-c", code.format(("torch", "transformers", "peft", "yaml", "pydantic")))
    assert done.stdout.strip() == str(sorted(["torch", "transformers", "peft", "yaml", "pydantic"]))


def test_the_runner_and_the_profiler_import_within_the_closure(remote_env):
    env, _ = remote_env
    done = _run(
        env,
        "-c",
        "import tasks.evaluate.remote, tasks.evaluate.evaluation_file\n"
        "import tasks.bench.profile, serving.loader\n"
        # the GPU run kit's steps, and what they run there
        "import tasks.gpu.there, tasks.gpu.steps, tasks.bench.bench, tasks.loop.learned\n"
        "import serving.models.lora\n" + ORIGINS,
        ORIGIN_ROOTS=json.dumps([str(PROJECT_ROOT), sys.prefix]),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # nothing on the path, nor imported, from outside the environment and the repository
    assert json.loads(done.stdout.splitlines()[-1]) == {"path": [], "modules": []}


def test_specops_profile_runs_its_callback_within_the_closure(remote_env):
    # A target off the engine is refused after the callback ran and before any model loads:
    # the CLI and its callback work without the registry's settings.
    done = _run(remote_env[0], "-m", "specops", "profile", "--hardware", "cpu-vllm")
    assert "ModuleNotFoundError" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 2, done.stdout + done.stderr[-3000:]
    assert "'vllm' backend" in done.stdout + done.stderr


def test_a_bundle_is_evaluated_within_the_closure(remote_env, registry, tmp_path, model_folder):
    # Prepared here (the registry's side), evaluated by the runner in the bare environment on
    # the tiny target, read back here: the runner's lazy imports (the engine, the loader,
    # the evaluation) need nothing outside the closure either.
    bundle, _, _ = pld_bundle(registry, model_folder, tmp_path, prompts=2)
    out = tmp_path / "evaluation.json"
    done = _run(
        remote_env[0], "-m", "tasks.evaluate.remote", str(bundle),
        "--target", str(model_folder), "--out", str(out), "--threads", "1",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    evaluation = read_evaluation_file(out)
    assert evaluation.hardware == "cpu" and evaluation.prompts == 2
    assert evaluation.report.results["challenger-0"].lossless
