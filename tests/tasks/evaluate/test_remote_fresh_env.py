"""The remote path in a fresh environment holding only ``REMOTE_PACKAGES`` and what they
need, at the lock's versions (uv installs them from its cache, the main environment's
set-up having filled it), with this checkout on ``PYTHONPATH``: the evaluation runner, the
profiler and the GPU run kit's steps import there, ``specops profile`` runs its callback,
and the runner evaluates a bundle on a tiny target and writes an evaluation file.

tests/tasks/evaluate/test_remote_closure.py checks the same closure faster, inside the
full environment, by refusing every distribution outside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from serving.drafters.package import DraftManifest, write_package
from serving.paths import PROJECT_ROOT
from tasks.evaluate.remote import REMOTE_PACKAGES
from tasks.gpu.kit import closure

pytestmark = pytest.mark.slow  # a venv of torch and transformers (~30 s from uv's cache)

LOCK = (
    PROJECT_ROOT / "requirements" / f"lock-py{sys.version_info.major}{sys.version_info.minor}.txt"
)
UV = Path(sys.executable).with_name("uv")
TORCH_WHEELS = os.environ.get("SPECOPS_TORCH_FIND_LINKS") or (
    "/opt/wheels" if Path("/opt/wheels").is_dir() else "https://download.pytorch.org/whl/cpu/torch/"
)


def _pins() -> list[str]:
    """The lock's lines for the closure of REMOTE_PACKAGES."""
    wanted = set(closure(REMOTE_PACKAGES))
    pins = [
        line.strip()
        for line in LOCK.read_text().splitlines()
        if "==" in line
        and not line.startswith((" ", "#"))
        and canonicalize_name(line.split("==")[0]) in wanted
    ]
    assert {canonicalize_name(p.split("==")[0]) for p in pins} == wanted, "lock lacks a line"
    return pins


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """The fresh environment's interpreter."""
    venv = tmp_path_factory.mktemp("remote") / "venv"
    started = time.perf_counter()
    base = getattr(sys, "_base_executable", sys.executable)
    made = subprocess.run(
        [str(UV), "venv", "--quiet", "--python", base, str(venv)], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    requirements = venv.parent / "requirements.txt"
    requirements.write_text("\n".join(_pins()) + "\n")
    done = subprocess.run(
        [str(UV), "pip", "install", "--quiet", "--no-deps", "--python", venv / "bin" / "python",
         "--find-links", TORCH_WHEELS, "-r", requirements],
        capture_output=True, text=True, env={**os.environ, "UV_SYSTEM_CERTS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, (
        f"building the fresh environment failed (uv pip install, exit {done.returncode}); "
        f"needs uv's cache or the package index: {done.stderr[-2000:]}"
    )
    print(f"fresh environment built in {time.perf_counter() - started:.0f} s")
    return venv / "bin" / "python"


def _run(python: Path, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    return subprocess.run(
        [str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_only_the_closure_is_installed_and_the_remote_path_imports(fresh, tmp_path):
    code = (
        "import importlib.metadata as m, json, sys\n"
        "import tasks.evaluate.remote, tasks.evaluate.evaluation_file, tasks.bench.profile\n"
        "import tasks.bench.bench, tasks.loop.learned, tasks.gpu.steps, tasks.gpu.there\n"
        "import serving.loader, serving.models.lora\n"
        "print(json.dumps({'dists': sorted(d.metadata['Name'] for d in m.distributions()),\n"
        "                  'path': sys.path}))\n"
    )
    done = _run(fresh, "-c", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    installed = {canonicalize_name(d) for d in seen["dists"]}
    assert installed <= set(closure(REMOTE_PACKAGES)) | {"pip", "specops"}, (
        installed
    )  # the checkout
    assert not {"mlflow", "prefect", "dvc", "great-expectations", "pydantic-settings"} & installed
    main_env = str(Path(sys.executable).parent.parent)
    assert not any(entry.startswith(main_env) for entry in seen["path"]), seen["path"]


def test_specops_profile_runs_its_callback_there(fresh, tmp_path):
    done = _run(fresh, "-m", "specops.cli", "profile", "--hardware", "cpu-vllm", cwd=tmp_path)
    assert "ModuleNotFoundError" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 2 and "'vllm' backend" in done.stdout + done.stderr


def test_the_runner_evaluates_a_bundle_there(fresh, tmp_path, long_context_folder):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(long_context_folder)
    bundle = tmp_path / "bundle"
    write_package(bundle / "packages" / "challenger-0", DraftManifest(drafter="pld:3", k=4))
    (bundle / "request.json").write_text(json.dumps({
        "format": 1, "hardware": "cpu", "max_new_tokens": 8,
        "contenders": {"challenger-0": "ngram/1"},
    }))  # fmt: skip
    ids = tokenizer.encode("List three fruits, then list them again.")
    prompts = [{"id": "p0", "workload": "grounded", "token_ids": ids}]
    (bundle / "prompts.json").write_text(json.dumps(prompts))
    out = tmp_path / "evaluation.json"
    done = _run(
        fresh, "-m", "tasks.evaluate.remote", str(bundle), "--target", str(long_context_folder),
        "--threads", "1", "--out", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    from tasks.evaluate.evaluation_file import read_evaluation_file

    evaluation = read_evaluation_file(out)
    assert evaluation.report.results["challenger-0"].lossless
