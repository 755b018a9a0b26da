"""Backend tests that run inside a backend's own environment (``.venv-vllm``, ``.venv-mlx``).

They load what ``scripts/prepare_backend_tests.py`` wrote (``$SPECOPS_BACKEND_FIXTURES``)
and drive :mod:`serving.backends.run` in a subprocess, as evaluation does. In the main
environment they are skipped; in a backend's CI job ``SPECOPS_REQUIRE_BACKEND`` names the
backend and makes a missing library or fixture a failure, never a skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def require(backend: str, module: str) -> Path:
    """The fixtures folder, or skip (fail when this job is ``backend``'s)."""
    required = os.environ.get("SPECOPS_REQUIRE_BACKEND") == backend
    fixtures = os.environ.get("SPECOPS_BACKEND_FIXTURES")
    problem = None
    if importlib.util.find_spec(module) is None:
        problem = f"{module!r} is not installed in this environment"
    elif not fixtures or not (Path(fixtures) / "ready.json").is_file():
        problem = "SPECOPS_BACKEND_FIXTURES does not point at prepared fixtures"
    if problem:
        if required:
            pytest.fail(f"{backend} backend tests cannot run: {problem}")
        pytest.skip(f"{backend} backend tests need their environment: {problem}")
    assert fixtures is not None
    return Path(fixtures)


def run_request(request: dict, tmp_path: Path, timeout: float = 900) -> dict:
    """Run one evaluation request through ``python -m serving.backends.run``."""
    request_path, report_path = tmp_path / "request.json", tmp_path / "report.json"
    request_path.write_text(json.dumps(request))
    completed = subprocess.run(
        [sys.executable, "-m", "serving.backends.run", str(request_path), str(report_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads(report_path.read_text())


def request_for(
    fixtures: Path,
    backend: str,
    model: str,
    contenders: dict,
    *,
    prompts: int,
    max_new_tokens: int,
    prompt_tokens: int | None = None,
) -> dict:
    """An evaluation request; ``prompt_tokens`` keeps each prompt's first that many tokens."""
    from serving.backends.exports import load_export

    speculations = {
        name: (
            load_export(fixtures / "exports" / model / backend / spec, backend).to_dict()
            if isinstance(spec, str)
            else spec
        )
        for name, spec in contenders.items()
    }
    return {
        "backend": backend,
        "target": str((fixtures / model).resolve()),
        "options": {"threads": 2, "dtype": "float32", "device": "cpu"},
        "contenders": speculations,
        "prompts": [
            {**prompt, "token_ids": prompt["token_ids"][:prompt_tokens]}
            for prompt in json.loads((fixtures / "prompts.json").read_text())[:prompts]
        ],
        "max_new_tokens": max_new_tokens,
    }


def check_exact(report: dict, name: str) -> dict:
    result = report["results"][name]
    assert report["results"]["plain"]["generated_tokens"] > 0
    assert result["exact"], f"{name}: outputs differ from plain greedy on {result}"
    assert report["outputs"][name] == report["outputs"]["plain"]
    return result
