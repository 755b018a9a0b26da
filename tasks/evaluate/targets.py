"""Evaluate drafts on every hardware target, each through its own backend and environment.

For one hardware target (``configs/hardware.yaml``): export every draft package to the
target's backend format (:mod:`tasks.evaluate.export`), tokenize the held-out prompts once here,
and run :mod:`serving.backends.run` with the backend's own interpreter (``.venv-vllm``,
``.venv-mlx``; the main one for ``transformers``). What comes back — acceptance, mean
accepted length, tokens/s with and without speculation measured interleaved, and an
exactness check against that backend's own plain greedy output — is keyed by the target,
for MLflow and for the side-by-side table (:func:`table`).

Everything that can be checked is checked before any model loads: the target exists and
runs on this machine, the backend's environment is installed, each draft can be exported
for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NotRequired, TypedDict

from serving.backends import (
    BackendUnavailableError,
    Speculation,
    UnsupportedDraftError,
    backend_info,
)
from serving.errors import BadInputError, ModelSourceError
from serving.hardware import HardwareTarget, hardware_target
from serving.paths import PROJECT_ROOT
from serving.target import DEFAULT_TARGET
from tasks.data.prompts import Prompt
from tasks.evaluate.export import export_draft, load_export, speculation_for, target_folder
from tasks.json_types import JsonObject

RUN_TIMEOUT_S = 3600


class TokenizedPrompt(TypedDict):
    """A held-out prompt as the backend runner reads it."""

    id: str
    workload: str
    token_ids: list[int]


class BackendRequest(TypedDict):
    """What :mod:`serving.backends.run` is asked to run (``contenders``: speculation
    settings by name, beside the plain engine it always runs)."""

    backend: str
    target: str
    options: JsonObject  # the backend's keyword arguments (threads, dtype, device, ...)
    prompts: list[TokenizedPrompt]
    max_new_tokens: int
    contenders: NotRequired[dict[str, JsonObject]]


class BackendFigures(TypedDict):
    """One contender's figures over the prompts (``serving.backends.run.summarize``);
    ``plain_tokens_per_s``: the plain engine's run beside it."""

    requests: int
    generated_tokens: int
    seconds: float
    checks: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float | None
    mean_accepted_length: float | None
    acceptance_by_position: list[float | None]
    tokens_per_s: float | None
    speedup: float | None
    exact: bool
    mismatched_prompts: list[str]  # prompt ids
    plain_tokens_per_s: NotRequired[float | None]


class PromotionDecision(TypedDict):
    promoted: str | None  # the label promoted, if any
    reason: str
    winner: NotRequired[str]


class TargetReport(TypedDict):
    """One hardware target's evaluation (:func:`evaluate_target`); ``decision``: added
    when the registered drafts were weighed for promotion there."""

    backend: str
    hardware: str
    target: str
    options: JsonObject
    prompts: int
    max_new_tokens: int
    contenders: dict[str, JsonObject]  # speculation settings by name
    results: dict[str, BackendFigures]  # "plain" and each contender
    per_prompt: dict[str, list[JsonObject]]  # the runner's per-request rows
    drafters: dict[str, str]
    unsupported: dict[str, str]  # draft -> why this backend cannot load it
    decision: NotRequired[PromotionDecision]


def backend_python(backend: str) -> Path:
    """The interpreter of ``backend``'s environment: ``$SPECOPS_<BACKEND>_PYTHON``, else
    ``.venv-<extra>/bin/python`` in the repository, else (transformers) this one."""
    info = backend_info(backend)
    override = os.environ.get(f"SPECOPS_{backend.upper()}_PYTHON")
    if override:
        path = Path(override)
    elif info.env_dir is None:
        return Path(sys.executable)
    else:
        path = PROJECT_ROOT / info.env_dir / "bin" / "python"
    if not path.is_file():
        raise BackendUnavailableError(
            f"backend {backend!r} runs in its own environment, and {str(path)!r} does not "
            f"exist; install it with: {info.install}"
        )
    return path


def runnable_target(name: str) -> HardwareTarget:
    """The hardware target named ``name``, refused unless it runs on this machine."""
    return check_runnable(hardware_target(name))


def check_runnable(hardware: HardwareTarget) -> HardwareTarget:
    """``hardware``, refused unless it runs on this machine."""
    if not hardware.runs_here:
        raise BadInputError(
            f"hardware target {hardware.name!r} ({hardware.backend} on {hardware.device}) "
            "cannot run on this machine; its code is real but untested here (see "
            "docs/targets.md)"
        )
    return hardware


def tokenize(prompts: Sequence[Prompt], folder: Path) -> list[TokenizedPrompt]:
    from transformers import AutoTokenizer

    from serving.loader import encode_messages

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return [
        {"id": p.id, "workload": p.workload, "token_ids": encode_messages(tokenizer, p.messages)}
        for p in prompts
    ]


def run_backend(backend: str, request: BackendRequest, workdir: Path) -> JsonObject:
    """Run :mod:`serving.backends.run` in ``backend``'s environment; return its report
    (as :func:`serving.backends.run.run` writes it)."""
    python = backend_python(backend)
    workdir.mkdir(parents=True, exist_ok=True)
    request_path = workdir / f"request-{backend}.json"
    report_path = workdir / f"report-{backend}.json"
    request_path.write_text(json.dumps(request))
    report_path.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    threads = str(request.get("options", {}).get("threads", 2))
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    completed = subprocess.run(
        [str(python), "-m", "serving.backends.run", str(request_path), str(report_path)],
        cwd=PROJECT_ROOT,
        env=env,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    if not report_path.is_file():
        raise ModelSourceError(
            f"backend {backend!r} exited with status {completed.returncode} and no report; "
            "its output above says why"
        )
    report = json.loads(report_path.read_text())
    if "error" in report:
        raise ModelSourceError(f"backend {backend!r}: {report['error']}: {report['message']}")
    return report


def evaluate_target(
    hardware: HardwareTarget,
    drafts: dict[str, Path],
    prompts: Sequence[Prompt],
    *,
    workdir: Path,
    target: str = DEFAULT_TARGET,
    max_new_tokens: int = 64,
    k: int | None = None,
    exports: dict[str, Path] | None = None,
) -> TargetReport:
    """Evaluate draft packages (``name -> folder``) on ``hardware`` (refused unless it runs
    here), with ``target`` (a model source: :data:`~serving.target.DEFAULT_TARGET` or a
    model folder) as the target. ``exports`` may give ready exports (``name -> export
    folder``, e.g. from the registry) instead."""
    spec = check_runnable(hardware)
    backend = spec.backend
    backend_python(backend)  # installed? (before any model work)
    if not prompts:
        raise BadInputError("no evaluation prompts")
    if not drafts and not exports:
        raise BadInputError("nothing to evaluate: give at least one draft")
    k = k or spec.num_speculative_tokens
    from serving.engine.drafters.package import read_manifest

    unsupported: dict[str, str] = {}
    for name, package in list(drafts.items()):  # exportable? (before any model work)
        try:
            speculation_for(read_manifest(package).drafter, backend, k)
        except UnsupportedDraftError as error:
            unsupported[name] = str(error)
    drafts = {n: p for n, p in drafts.items() if n not in unsupported}
    if not drafts and not exports:
        raise UnsupportedDraftError(
            f"no draft given can run on {spec.name!r}: " + "; ".join(unsupported.values())
        )
    folder = target_folder(target)
    speculations: dict[str, Speculation] = {}
    for name, package in drafts.items():
        exported = export_draft(
            package, backend, workdir / "exports" / name / backend, k=k, target=target
        )
        speculations[name] = load_export(exported, backend)
    for name, exported in (exports or {}).items():
        speculations[name] = load_export(exported, backend)
    base: BackendRequest = {
        "backend": backend,
        "target": str(folder),
        "options": {
            "threads": spec.threads,
            "dtype": spec.dtype,
            "device": spec.device,
            # the engine loads the target for the CPU target with these kernels
            # (serving.hardware.cpu_target_for)
            **({"kernels": spec.kernels} if backend == "transformers" else {}),
        },
        "prompts": tokenize(prompts, folder),
        "max_new_tokens": max_new_tokens,
    }
    # One process per contender, each with its own plain engine, interleaved with it:
    # vLLM 0.32 cannot build a third engine in one process (its Triton-kernel registry
    # fails re-binding), and a per-process pair keeps every ratio a same-process one.
    report: TargetReport = {
        "backend": backend,
        "hardware": spec.name,
        "target": str(folder),
        "options": base["options"],
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "contenders": {},
        "results": {},
        "per_prompt": {},
        "drafters": {name: read_manifest(package).drafter for name, package in drafts.items()},
        "unsupported": unsupported,
    }
    for name, speculation in speculations.items():
        part = run_backend(
            backend, {**base, "contenders": {name: speculation.to_dict()}}, workdir / name
        )
        report["contenders"][name] = part["contenders"][name]
        report["results"].setdefault("plain", part["results"]["plain"])
        result: BackendFigures = part["results"][name]
        report["results"][name] = {
            **result,
            "plain_tokens_per_s": part["results"]["plain"]["tokens_per_s"],
        }
        report["per_prompt"][name] = part["per_prompt"][name]
        report["per_prompt"][f"plain ({name})"] = part["per_prompt"]["plain"]
    return report


def metrics_of(result: BackendFigures, plain: BackendFigures) -> dict[str, float]:
    """The MLflow metrics of one contender's result (keyed by target by the registry)."""
    out = {
        "tokens_per_s": result["tokens_per_s"],
        "plain_tokens_per_s": result.get("plain_tokens_per_s", plain["tokens_per_s"]),
        "speedup": result["speedup"],
        "mean_accepted_length": result["mean_accepted_length"],
        "acceptance_rate": result["acceptance_rate"],
        "exact": float(result["exact"]),
    }
    return {k: float(v) for k, v in out.items() if v is not None}


def table(reports: Sequence[TargetReport]) -> str:
    """The side-by-side table: one row per (target, contender)."""
    header = (
        f"{'target':<12} {'backend':<12} {'draft':<14} {'accept':>7} {'MAL':>5} "
        f"{'plain tok/s':>11} {'spec tok/s':>10} {'speedup':>7} {'exact':>5}"
    )
    lines = [header, "-" * len(header)]

    def fmt(value: float | None, spec: str) -> str:
        return format(value, spec) if value is not None else "-"

    for report in reports:
        plain = report["results"]["plain"]
        for name, result in report["results"].items():
            if name == "plain":
                continue
            lines.append(
                f"{report['hardware']:<12} {report['backend']:<12} {name:<14} "
                f"{fmt(result['acceptance_rate'], '7.2f'):>7} "
                f"{fmt(result['mean_accepted_length'], '5.2f'):>5} "
                f"{fmt(result.get('plain_tokens_per_s', plain['tokens_per_s']), '11.1f'):>11} "
                f"{fmt(result['tokens_per_s'], '10.1f'):>10} "
                f"{fmt(result['speedup'], '6.2f') + 'x':>7} {'yes' if result['exact'] else 'NO':>5}"
            )
        for name in report.get("unsupported", {}):
            lines.append(
                f"{report['hardware']:<12} {report['backend']:<12} {name:<14} "
                "(this backend cannot load this draft)"
            )
    return "\n".join(lines)
