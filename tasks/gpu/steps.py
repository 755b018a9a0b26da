"""The GPU run kit's steps, each run in its own process by :mod:`tasks.gpu.there`:

    python -m tasks.gpu.steps STEP KIT RESULTS

``setup`` joins the kit's files (every checksum checked), installs the wheels the machine
lacks into ``KIT/work/site`` (first on ``PYTHONPATH``; nothing of the machine's own is
changed), converts the GGUF, and records the machine. The others read what it left under
``KIT/work`` and write their results into ``RESULTS``.
"""

from __future__ import annotations

import importlib
import json
import platform
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from importlib.metadata import PackageNotFoundError, version
from itertools import zip_longest
from pathlib import Path

from serving.errors import BadInputError
from tasks.gpu.manifest import KIT_PACKAGES, KitManifest, read_manifest
from tasks.gpu.parts import join_file

SETUP_DONE = ".setup-complete"
NVIDIA_FIELDS = (
    "name",
    "driver_version",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "clocks.max.mem",
    "power.limit",
    "temperature.gpu",
    "memory.total",
)
REMOTE_VERSIONS = ("torch", "transformers", "peft", "accelerate", "pydantic", "gguf", "vllm")


def _write(path: Path, data: dict) -> None:
    from serving.atomic import write_json_atomic

    write_json_atomic(path, data)


def _work(kit: Path) -> Path:
    return kit / "work"


def _model(kit: Path) -> str:
    return str(_work(kit) / "model")


def _require_setup(kit: Path) -> None:
    if not (_work(kit) / SETUP_DONE).is_file():
        raise BadInputError(f"{kit} is not set up: run `bash run.sh setup` (or measure) first")


def _extract(archive: Path, folder: Path) -> Path:
    if folder.is_dir():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
    return folder


def _wheel_needed(wheel: str) -> bool:
    """The machine lacks the wheel's distribution, or has another version of one the kit
    needs at its own (pydantic 1 would not do); a dependency it has at any version is
    left as it is."""
    name, wanted = wheel.split("-")[:2]
    try:
        found = version(name)
    except PackageNotFoundError:
        return True
    pinned = name.lower().replace("_", "-") in KIT_PACKAGES
    return pinned and found != wanted


def install_wheels(kit: Path, manifest: KitManifest) -> list[str]:
    """Unpack the wheels the machine lacks into ``KIT/work/site`` (a wheel is a zip of
    what goes on ``sys.path``)."""
    site = _work(kit) / "site"
    installed = []
    for role in manifest.wheels():
        entry = manifest.files[role]
        if not _wheel_needed(entry.name):
            continue
        wheel = join_file(kit, entry, _work(kit) / "wheels" / entry.name)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
        installed.append(entry.name)
    if installed:
        sys.path_importer_cache.pop(str(site), None)
        importlib.invalidate_caches()
    return installed


def _nvidia_smi() -> dict[str, str] | str:
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi not found"
    done = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(NVIDIA_FIELDS)}", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return f"nvidia-smi failed: {done.stderr.strip()[:300]}"
    values = [v.strip() for v in done.stdout.splitlines()[0].split(",")]
    return dict(zip(NVIDIA_FIELDS, values, strict=False))


def machine() -> dict:
    """The machine the kit ran on: GPU, driver, CUDA, clocks, and the packages' versions."""
    import torch

    info: dict = {
        "host": platform.node(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "nvidia_smi": _nvidia_smi(),
        "versions": {},
    }
    for name in REMOTE_VERSIONS:
        try:
            info["versions"][name] = version(name)
        except PackageNotFoundError:
            info["versions"][name] = None
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        info["gpu"] = {
            "name": properties.name,
            "capability": f"{properties.major}.{properties.minor}",
            "memory_gib": round(properties.total_memory / 2**30, 1),
        }
    return info


def setup(kit: Path, manifest: KitManifest, out: Path) -> None:
    work = _work(kit)
    installed = install_wheels(kit, manifest)
    print(f"wheels installed into {work / 'site'}: {installed or 'none needed'}")
    model = manifest.files["model"]
    joined = join_file(kit, model, work / model.name)
    if manifest.model_kind == "gguf":
        from serving.models.real import convert_gguf

        convert_gguf(joined, work / "model", progress=False)
    else:
        _extract(joined, work / "model")
    _extract(join_file(kit, manifest.files["bundle"], work / "bundle.tar"), work / "bundle")
    if "teacher" in manifest.files:
        teacher = join_file(kit, manifest.files["teacher"], work / "teacher.tar")
        _extract(teacher, work / "teacher")
    _write(out / "provenance.json", {"kit": manifest.to_dict(), "machine": machine()})
    (work / SETUP_DONE).write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    print(f"set up: model, bundle{', teacher data' if 'teacher' in manifest.files else ''}")


def tests(kit: Path, manifest: KitManifest, out: Path) -> None:
    _require_setup(kit)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            *manifest.settings.tests,  # the device tests; the captured step against eager
        ],
        capture_output=True,
        text=True,
    )
    (out / "tests.txt").write_text(done.stdout + done.stderr)
    summary = (done.stdout.strip().splitlines() or ["no output"])[-1]
    _write(out / "tests.json", {"returncode": done.returncode, "summary": summary})
    print(summary)
    if done.returncode != 0:
        raise SystemExit(done.returncode)


def profile(kit: Path, manifest: KitManifest, out: Path) -> None:
    """The verify curve (and batch curve), written to ``RESULTS`` and into the kit's own
    ``configs/hardware.yaml``, so the steps after it price drafts with what was measured."""
    from serving.hardware import HARDWARE_CONFIG, engine_target
    from tasks.bench.profile import profile_batch_hardware, profile_hardware
    from tasks.gpu.hardware_yaml import set_target_key

    _require_setup(kit)
    settings, hardware = manifest.settings, manifest.hardware
    spec = engine_target(hardware, require_curve=False)  # what measures its curve
    result = profile_hardware(
        spec,
        source=_model(kit),
        threads=settings.threads,
        max_n=settings.max_n,
        context=settings.context,
        repeats=settings.repeats,
        progress=False,
    )
    _write(out / "profile.json", {"hardware": hardware, **result})
    print(f"verify curve: {result['config_curve']}")
    comment = [f"measured by the GPU run kit's profile step ({settings.repeats} repeats)"]
    set_target_key(HARDWARE_CONFIG, hardware, "verify_curve", result["config_curve"], comment)
    if settings.batch_profile:
        batched = profile_batch_hardware(
            spec,
            source=_model(kit),
            threads=settings.threads,
            repeats=max(3, settings.repeats // 3),
            progress=False,
        )
        _write(out / "profile-batch.json", {"hardware": hardware, **batched})
        curve = [list(point) for point in batched["batch_curve"]]
        set_target_key(HARDWARE_CONFIG, hardware, "batch_curve", curve, comment)
        print(f"batch curve: {curve}")


def _prompts(kit: Path, count: int | None = None) -> list:
    """The bundle's prompts, or ``count`` of them taken in turn from each workload (the
    bundle lists them workload by workload: the first ``count`` alone would leave the last
    workloads out)."""
    from tasks.evaluate.remote import read_bundle

    _, prompts = read_bundle(_work(kit) / "bundle")
    if count is None:
        return prompts
    by_workload: dict[str, list] = {}
    for prompt in prompts:
        by_workload.setdefault(prompt.workload, []).append(prompt)
    in_turn = [p for row in zip_longest(*by_workload.values()) for p in row if p is not None]
    return in_turn[:count]


def bench(kit: Path, manifest: KitManifest, out: Path) -> None:
    from tasks.bench.bench import BenchConfig, run_bench

    _require_setup(kit)
    settings = manifest.settings
    config = BenchConfig.model_validate(
        {
            "max_new_tokens": settings.bench_max_new_tokens,
            "threads": settings.threads,
            "hardware": manifest.hardware,
            "bandwidth_mb": 64,
            "methods": [
                {"name": "hf-greedy", "engine": "hf", "mode": "greedy"},
                {"name": "hf-prompt-lookup", "engine": "hf", "mode": "prompt_lookup"},
                {"name": "hf-static", "engine": "hf", "mode": "static"},
                {"name": "specops-none", "engine": "specops", "drafter": "none"},
                # Before the graphed step (serving/lean/graphed.py): transformers' forward.
                {
                    "name": "specops-none-eager",
                    "engine": "specops",
                    "drafter": "none",
                    "step": "transformers",
                },
                {
                    "name": "specops-pld",
                    "engine": "specops",
                    "drafter": "pld",
                    "k": 10,
                    "policy": "cost",
                },
            ],
        }
    )
    result = run_bench(
        config,
        out_dir=out / "bench",
        target=_model(kit),
        progress=False,
        prompts=_prompts(kit, settings.bench_prompts),
        draw=False,
    )
    for row in result["summary"]:
        print(f"{row['method']}: {row.get('tokens_per_s')} tok/s, identical {row.get('identical')}")


def train(kit: Path, manifest: KitManifest, out: Path) -> None:
    from serving.errors import SpecOpsError
    from serving.loader import set_threads
    from tasks.loop.learned import train_head_challenger, train_lora_challenger
    from tasks.loop.retrain_config import TargetRetrain

    _require_setup(kit)
    teacher = _work(kit) / "teacher"
    config = TargetRetrain.model_validate(manifest.settings.retrain)
    report: dict = {}
    if not teacher.is_dir():
        why = "the kit holds no teacher data (built without --dataset)"
        report = {family: {"skipped": why} for family in config.families}
    set_threads(config.threads)
    for family in config.families if teacher.is_dir() else []:
        settings = config.family(family)
        work = _work(kit) / "train"
        try:
            if family == "head":
                trained = train_head_challenger(
                    teacher, work, settings, init_head=None, target=_model(kit), progress=False
                )
            else:
                trained = train_lora_challenger(
                    teacher, work, settings, target=_model(kit), progress=False
                )
        except SpecOpsError as error:
            report[family] = {"skipped": str(error)}
            print(f"{family}: skipped: {error}")
            continue
        if trained.package is None:
            report[family] = {"skipped": trained.skipped or "no package"}
            continue
        folder = out / "trained" / family
        if folder.exists():
            shutil.rmtree(folder)
        shutil.copytree(trained.package, folder)
        report[family] = {
            "package": f"trained/{family}",
            "summary": trained.summary,
            "params": trained.params,
            "bytes": sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()),
        }
        print(trained.summary)
    _write(out / "trained.json", report)


def _contender_packages(kit: Path, out: Path) -> dict[str, Path]:
    """The bundle's draft packages and the trained ones, by contender name."""
    from tasks.evaluate.remote import read_bundle

    request, _ = read_bundle(_work(kit) / "bundle")
    packages = {n: _work(kit) / "bundle" / "packages" / n for n in request["contenders"]}
    trained_file = out / "trained.json"
    trained = json.loads(trained_file.read_text()) if trained_file.is_file() else {}
    for family, entry in trained.items():
        if entry.get("package"):
            packages[f"trained-{family}"] = out / entry["package"]
    return packages


def evaluate(kit: Path, manifest: KitManifest, out: Path) -> None:
    """The bundle's contenders and the trained challengers on the bundle's prompts, one
    interleaved run; labels of the trained ones are given back here, at ingest."""
    import torch
    import transformers

    from serving.hardware import engine_target
    from serving.loader import load_target, set_threads
    from tasks.evaluate.evaluate import Contender
    from tasks.evaluate.evaluate import evaluate as run_evaluation
    from tasks.evaluate.remote import read_bundle

    _require_setup(kit)
    request, prompts = read_bundle(_work(kit) / "bundle")
    spec = engine_target(manifest.hardware)
    set_threads(manifest.settings.threads)
    packages = _contender_packages(kit, out)
    contenders = [Contender(name, package) for name, package in packages.items()]
    labels: dict[str, str | None] = {n: request["contenders"].get(n) for n in packages}
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    target = load_target(_model(kit), spec)
    report = run_evaluation(
        contenders,
        prompts,
        target=target,
        max_new_tokens=int(request["max_new_tokens"]),
        progress=False,
    )
    device = spec.device + (
        f" ({torch.cuda.get_device_name()})" if spec.device.startswith("cuda") else ""
    )
    _write(
        out / "evaluation-run.json",
        {
            "hardware": manifest.hardware,
            "labels": labels,
            "prompts": len(prompts),
            "max_new_tokens": int(request["max_new_tokens"]),
            "produced_by": {
                "host": platform.node(),
                "device": device,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "started": started,
                "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "kit_commit": manifest.commit,
            },
            "report": report,
        },
    )
    for name in labels:
        result = report["results"][name]
        print(
            f"{name}: speedup {result['speedup']}, mean accepted length "
            f"{result['mean_accepted_length']}, lossless {result['lossless']}"
        )


def vllm(kit: Path, manifest: KitManifest, out: Path) -> None:
    """``cuda-vllm`` where vLLM is importable there: every contender vLLM can load,
    exported and run through :mod:`serving.backends.run` (one process each, interleaved with
    vLLM's own plain decoding); else the line that says why it was not evaluated
    (:mod:`tasks.gpu.vllm_step`)."""
    from tasks.gpu.vllm_step import run_vllm, vllm_version

    found = vllm_version(manifest, out)
    if found is None:
        return
    _require_setup(kit)
    prompts = [
        {"id": p.id, "workload": p.workload, "token_ids": p.token_ids}
        for p in _prompts(kit, manifest.settings.bench_prompts)
    ]
    run_vllm(
        manifest,
        out,
        found=found,
        work=_work(kit),
        model=_model(kit),
        prompts=prompts,
        packages=_contender_packages(kit, out),
    )


STEP_FUNCTIONS = {
    "setup": setup,
    "tests": tests,
    "profile": profile,
    "bench": bench,
    "train": train,
    "evaluate": evaluate,
    "vllm": vllm,
}


def main(argv: list[str] | None = None) -> int:
    step, kit, out = (argv or sys.argv[1:])[:3]
    kit_path, out_path = Path(kit), Path(out)
    out_path.mkdir(parents=True, exist_ok=True)
    STEP_FUNCTIONS[step](kit_path, read_manifest(kit_path), out_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
