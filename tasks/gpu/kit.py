"""Build a GPU run kit here: one folder that travels to a bare GPU machine in parts no
bigger than a transfer takes, and runs there with ``bash run.sh measure`` then ``bash run.sh
learn`` (:mod:`tasks.gpu.plan`), writing ``results/`` for ``specops gpu ingest``.

What it holds (``kit.json`` lists every file, its parts and their sha256):

- ``code``: this checkout's committed tree (``git archive HEAD``);
- ``model``: the shipped GGUF (converted to safetensors there, with the kit's ``gguf``
  wheel), or a model folder given with ``--target``;
- ``bundle``: an evaluation bundle (``specops targets bundle``): the target's champion and
  challengers, and the held-out prompts as token ids;
- ``teacher``: teacher data built here from a dataset's training mix (``--dataset``), for
  the head and LoRA challengers trained there;
- ``wheel:*``: the small packages the remote path needs beyond the machine's own torch,
  transformers, peft and accelerate (:data:`tasks.evaluate.remote.REMOTE_PACKAGES`), plus
  pytest and bitsandbytes, for the machine's Python, at this lock's versions.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field, replace
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from serving.atomic import atomic_dir
from serving.errors import BadInputError, SpecOpsError
from serving.hardware import HardwareTarget
from serving.paths import PROJECT_ROOT
from serving.target import DEFAULT_TARGET
from tasks.gpu.manifest import (
    KIT_PACKAGES,
    MIB,
    TRAINING_PACKAGES,
    KitManifest,
    KitSettings,
    write_manifest,
)
from tasks.gpu.parts import SplitFile, split_file
from tasks.gpu.plan import STEPS
from tasks.loop.retrain_config import TargetRetrain

DEFAULT_PART_SIZE = 60 * MIB
TRANSFER_LIMIT = 64 * MIB  # what one transfer to a lent machine carries
# Never carried: the machine's own, and the large packages they bring (a bare GPU machine
# had these, and not pydantic or typer, though this environment's transformers needs them).
MACHINE_OWN = (
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "numpy",
    "tokenizers",
    "safetensors",
    "huggingface-hub",
    "triton",
    "hf-xet",
)
# x86-64 Linux wheels a glibc of 2.28 or later takes (bitsandbytes ships manylinux_2_24).
PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in (17, 24, 26, 27, 28)),
    "manylinux2014_x86_64",
    "linux_x86_64",
    "any",
)


@dataclass(frozen=True)
class KitOptions:
    out: Path
    bundle: Path  # from `specops targets bundle`
    target: str = DEFAULT_TARGET  # or a local model folder (a rehearsal's tiny one)
    dataset: Path | None = None  # a dataset folder whose train_mix the teacher data comes from
    part_size: int = DEFAULT_PART_SIZE
    wheels: bool = True
    python: str = "3.12"  # the GPU machine's Python, for the wheels
    settings: KitSettings = field(default_factory=KitSettings)
    # The learned families' settings there; default: configs/retrain.yaml's for the target.
    retrain: TargetRetrain | None = None


def closure(names: tuple[str, ...], stop: tuple[str, ...] = ()) -> dict[str, str]:
    """Installed distributions ``names`` need (extras left out; one not installed here is
    left out too), not descending into ``stop``: canonical name -> version."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found: dict[str, str] = {}
    todo = [canonicalize_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in found or name in stop:
            continue
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue
        found[name] = dist.version
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    return found


def wheel_pins(*, training: bool = True) -> list[str]:
    """``name==version`` for every package the kit brings as a wheel: the closure of
    :data:`KIT_PACKAGES` (and, for a kit that trains, :data:`TRAINING_PACKAGES`) less
    :data:`MACHINE_OWN`, at the versions installed here (the lock's). There, a wheel is
    installed only where the machine lacks its package (or, for the named packages
    themselves, has another version)."""
    wanted = KIT_PACKAGES + (TRAINING_PACKAGES if training else ())
    return sorted(f"{n}=={v}" for n, v in closure(wanted, stop=MACHINE_OWN).items())


def download_wheels(folder: Path, python: str, *, training: bool = True) -> list[Path]:
    """The kit's wheels for CPython ``python`` on x86-64 Linux, fetched from the package
    index into ``folder``."""
    version = python.replace(".", "")
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        version,
        "--implementation",
        "cp",
        "--dest",
        str(folder),
        *[a for platform in PLATFORMS for a in ("--platform", platform)],
        *wheel_pins(training=training),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SpecOpsError(
            f"fetching the kit's wheels for Python {python} failed (pip download, exit "
            f"{done.returncode}): {done.stderr.strip()[-1500:]}; build with --no-wheels if the "
            "GPU machine has them"
        )
    return sorted(folder.glob("*.whl"))


def _git_archive(out: Path) -> str:
    """This checkout's committed tree as a tar.gz; returns the commit (``+dirty`` when
    tracked files differ from it: the kit carries the commit, not the changes)."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), *args], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise BadInputError(
                f"the kit carries this checkout's committed code, but `git {' '.join(args)}` "
                f"failed in {PROJECT_ROOT}: {done.stderr.strip()}"
            )
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD")
    git("archive", "--format=tar.gz", "-o", str(out), "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return commit + ("+dirty" if dirty else "")


def _bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def _tar(folder: Path, out: Path) -> Path:
    with tarfile.open(out, "w") as archive:
        archive.add(folder, arcname=".")
    return out


def _teacher(options: KitOptions, dataset: Path, hardware: HardwareTarget, scratch: Path) -> Path:
    """Teacher data from the dataset's training mix, one teacher-forced pass of the target
    here (:func:`tasks.train.store_teacher.build_store_teacher`, as the retrain does)."""
    from tasks.data.dataset import read_part
    from tasks.loop.learned import training_target
    from tasks.loop.retrain_config import load_retrain_config
    from tasks.train.store_teacher import build_store_teacher

    config = options.retrain or load_retrain_config().target(hardware)
    records = read_part(dataset, "train_mix")
    target = training_target(options.target)
    folder = scratch / "teacher"
    build_store_teacher(
        records,
        target.model,
        folder,
        eos_token_ids=target.eos_token_ids,
        min_sequences=config.min_sequences,
        min_answer_tokens=config.min_answer_tokens,
        progress=False,
    )
    return folder


def _retrain_settings(options: KitOptions, hardware: HardwareTarget) -> dict:
    """The learned families' settings (``configs/retrain.yaml``'s for ``hardware`` unless
    given), each family's budget scaled to the kit's (a lent machine's minutes)."""
    from tasks.loop.retrain_config import load_retrain_config

    budget_s = options.settings.train_budget_s
    config = options.retrain or load_retrain_config().target(hardware)
    if config.families:
        config = config.with_budgets(dict.fromkeys(config.families, budget_s))
    return config.model_dump(mode="json")


def build_kit(options: KitOptions, *, say=print) -> KitManifest:
    """Write the kit into ``options.out`` (atomically) and return its manifest."""
    from serving.hardware import engine_target
    from tasks.evaluate.remote import read_bundle

    request, _ = read_bundle(options.bundle)
    hardware = str(request["hardware"])
    engine = engine_target(hardware, require_curve=False)  # the specops engine runs it
    if options.part_size < MIB:
        raise BadInputError(f"--part-size must be at least 1 MiB, got {options.part_size} bytes")
    if options.dataset is not None and not Path(options.dataset).is_dir():
        raise BadInputError(f"--dataset {options.dataset} is not a dataset folder")
    target_folder = None if options.target == DEFAULT_TARGET else Path(options.target)
    if target_folder is not None and not (target_folder / "config.json").is_file():
        raise BadInputError(f"--target {options.target!r} is neither smollm2 nor a model folder")
    files: dict[str, SplitFile] = {}
    with atomic_dir(Path(options.out)) as kit:
        whole = kit / ".whole"
        whole.mkdir()

        def add(role: str, path: Path, name: str) -> None:
            files[role] = split_file(path, kit, name, options.part_size)
            say(f"  {role}: {files[role].bytes / MIB:.1f} MiB in {len(files[role].parts)} part(s)")

        say(f"GPU run kit for {hardware} -> {options.out}")
        commit = _git_archive(whole / "code.tar.gz")
        add("code", whole / "code.tar.gz", "code.tar.gz")
        if target_folder is None:
            from serving.models.real import gguf_path

            add("model", gguf_path(), gguf_path().name)
        else:
            add("model", _tar(target_folder, whole / "model.tar"), "model.tar")
        add("bundle", _tar(Path(options.bundle), whole / "bundle.tar"), "bundle.tar")
        packages = {
            name: f"{label}: {_bytes(Path(options.bundle) / 'packages' / name)} bytes"
            for name, label in request["contenders"].items()
        }
        for name, line in packages.items():
            say(f"    {name} {line}")
        if options.dataset is not None:
            say("  teacher data: one teacher-forced pass over the training mix here")
            teacher = _teacher(options, options.dataset, engine, whole)
            add("teacher", _tar(teacher, whole / "teacher.tar"), "teacher.tar")
        if options.wheels:
            training = options.dataset is not None
            pins = " ".join(wheel_pins(training=training))
            say(f"  wheels for Python {options.python}: {pins}")
            for wheel in download_wheels(whole / "wheels", options.python, training=training):
                add(f"wheel:{wheel.name}", wheel, wheel.name)
        shutil.rmtree(whole)
        settings = replace(
            options.settings,
            retrain=_retrain_settings(options, engine),
        )
        manifest = KitManifest(
            hardware=hardware,
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            commit=commit,
            part_size=options.part_size,
            model_kind="gguf" if target_folder is None else "folder",
            files=files,
            settings=settings,
            packages=packages,
        )
        write_manifest(kit, manifest)
        (kit / "run.sh").write_text(run_script(manifest))
        (kit / "run.sh").chmod(0o755)
        check_sizes(kit, manifest)
    return manifest


def run_script(manifest: KitManifest) -> str:
    """``run.sh``: joins the code with the shell alone, then hands over to
    :mod:`tasks.gpu.there` (which joins, checks and installs the rest)."""
    code = manifest.files["code"]
    parts = " ".join(f'"$kit/{part.path}"' for part in code.parts)
    return f"""#!/usr/bin/env bash
# The specops GPU run kit for {manifest.hardware} (commit {manifest.commit}); kit.json lists
# every file. On the GPU machine, with this folder whole (every part copied in):
#   bash run.sh measure    # setup, device tests, profile, bench   (one command, <= 10 min)
#   bash run.sh learn      # train, evaluate, vllm                 (one command, <= 10 min)
#   bash run.sh all | STEP # everything, or one step (tasks/gpu/plan.py)
# Results land in results/ (RESULTS=DIR elsewhere); bring that folder back and run
#   specops gpu ingest results/
set -euo pipefail
kit=$(cd "$(dirname "$0")" && pwd)
python=${{PYTHON:-python3}}
code="$kit/work/code"
if [ ! -f "$code/.complete" ]; then
  mkdir -p "$code"
  cat {parts} > "$kit/work/code.tar.gz"
  echo "{code.sha256}  $kit/work/code.tar.gz" | sha256sum -c --quiet
  tar -xzf "$kit/work/code.tar.gz" -C "$code"
  touch "$code/.complete"
fi
export PYTHONPATH="$code:$kit/work/site${{PYTHONPATH:+:$PYTHONPATH}}"
cd "$code"
exec "$python" -m tasks.gpu.there "$kit" "$@" --out "${{RESULTS:-$kit/results}}"
"""


def check_sizes(kit: Path, manifest: KitManifest) -> None:
    """Every part within the part size, and every file of the kit within one transfer."""
    too_big = [
        f"{part.path} ({part.bytes / MIB:.1f} MiB)"
        for entry in manifest.files.values()
        for part in entry.parts
        if part.bytes > manifest.part_size
    ]
    too_big += [
        f"{path.name} ({path.stat().st_size / MIB:.1f} MiB)"
        for path in (kit / "kit.json", kit / "run.sh")
        if path.stat().st_size > manifest.part_size
    ]
    if too_big:
        raise SpecOpsError(f"parts over {manifest.part_size / MIB:.0f} MiB: {too_big}")


def transfers(manifest: KitManifest, limit: int = TRANSFER_LIMIT) -> list[list[str]]:
    """The kit's files grouped into transfers of at most ``limit`` bytes (first fit, the
    manifest and run.sh in the first)."""
    loads: list[tuple[int, list[str]]] = [(64 * 1024, ["kit.json", "run.sh"])]
    for entry in manifest.files.values():
        for part in entry.parts:
            for index, (size, names) in enumerate(loads):
                if size + part.bytes <= limit:
                    loads[index] = (size + part.bytes, [*names, part.path])
                    break
            else:
                loads.append((part.bytes, [part.path]))
    return [names for _, names in loads]


def plan_text(manifest: KitManifest, limit: int = TRANSFER_LIMIT) -> str:
    """The plan: the kit's files, its transfers, and each step with its expected time."""
    settings = manifest.settings
    lines = [
        f"kit for {manifest.hardware} (commit {manifest.commit}), parts <= "
        f"{manifest.part_size / MIB:.0f} MiB:"
    ]
    total = 0
    for role, entry in manifest.files.items():
        total += entry.bytes
        lines.append(f"  {role:<12} {entry.bytes / MIB:7.1f} MiB  {len(entry.parts)} part(s)")
    for name, line in manifest.packages.items():
        lines.append(f"    draft package {name} ({line})")
    groups = transfers(manifest, limit)
    lines.append(
        f"  {total / MIB:.1f} MiB in all: {len(groups)} transfer(s) of <= {limit / MIB:.0f} MiB"
    )
    lines.append("there (expected on an H100/H200-class GPU; killed past the limit):")
    by_command: dict[str, int] = {}
    for step in STEPS:
        by_command[step.command] = by_command.get(step.command, 0) + step.expected_s
        lines.append(
            f"  {step.command:<8} {step.name:<9} ~{step.expected_s:>4} s "
            f"(limit {step.limit_s} s)  {step.what}"
        )
    for command, seconds in by_command.items():
        lines.append(f"  bash run.sh {command}: ~{seconds} s of at most {settings.command_s} s")
    expected = sum(by_command.values())
    lines.append(f"  total: ~{expected} s of at most {settings.total_s} s of GPU time")
    lines.append("then here: specops gpu ingest <kit>/results")
    return "\n".join(lines)
