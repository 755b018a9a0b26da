"""Shipping the base head: a small committed folder, its checksums and where it came from.

``specops teacher ship`` turns the base-head stage's package into ``heads/base-HARDWARE/``:
``head/`` (its config, and its weights in bfloat16, a few MB) and ``manifest.json`` (a
:class:`ShippedHead`: each file's sha256, the corpus it learned from, its steps and seconds,
the commit it was built at, and its held-out score). :func:`verify_shipped_head` checks the
checksums and is what registers it (a head whose files were changed is refused with the
command that rebuilds it), so a shipped head is either the one the stages built or nothing.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from serving.atomic import atomic_dir
from serving.engine.drafters.kinds import DrafterSpec
from serving.engine.drafters.package import DraftManifest, write_package
from serving.engine.drafters.plan import DraftPlan
from serving.engine.policy import check_policy
from serving.errors import ModelSourceError
from serving.models.head import CONFIG_FILE, WEIGHTS_FILE
from serving.models.real import file_sha256
from tasks.evaluate.head_score import HeadScore, head_folder
from tasks.train.teacher import read_manifest

SHIP_FORMAT = 1
MANIFEST_FILE = "manifest.json"
HEAD_DIR = "head"
REBUILD = "dvc repro base_ship"


class ShippedCorpus(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    teacher: str  # the teacher cache's folder
    sequences: int
    tokens: int  # prompt and answer tokens
    features_from: str  # the hardware target whose lean step computed its features


class ShippedHead(BaseModel):
    """``manifest.json`` of a shipped head."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: int = SHIP_FORMAT
    files: dict[str, str]  # path under the folder -> sha256
    target: dict[str, object]  # the teacher cache's fingerprint of the target
    corpus: ShippedCorpus
    steps: int
    train_seconds: float
    train_tokens: int
    commit: str  # the git commit the stages ran at ("unknown" outside a checkout)
    heldout: HeadScore


def _commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() or "unknown"


def _bf16_weights(source: Path, destination: Path) -> None:
    """The head's weights with every float tensor in bfloat16 (ids stay integers)."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(source))
    small = {
        name: tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        for name, tensor in state.items()
    }
    save_file(small, str(destination), metadata={"format": "1"})


def ship_head(package: Path, teacher: Path, score_file: Path, out: Path) -> ShippedHead:
    """Write the head of ``package`` (trained on ``teacher``, scored in ``score_file``) as
    the shipped folder ``out`` (atomically)."""
    folder = head_folder(package)
    cache = read_manifest(teacher) if teacher.is_dir() else None
    if cache is None:
        raise ModelSourceError(f"no teacher cache at {teacher}: ship the head it trained on")
    metrics_file = package / "train_metrics.json"
    try:
        result = json.loads(metrics_file.read_text())["result"]
        score = HeadScore.model_validate_json(score_file.read_text())
    except (OSError, KeyError, json.JSONDecodeError, ValidationError) as error:
        raise ModelSourceError(f"cannot read the head's metrics or score: {error}") from None
    corpus = ShippedCorpus(
        teacher=str(teacher),
        sequences=sum(shard.sequences for shard in cache.shards),
        tokens=cache.tokens,
        features_from=str(cache.target.get("hardware", "transformers")),
    )
    with atomic_dir(out) as work:
        (work / HEAD_DIR).mkdir()
        (work / HEAD_DIR / CONFIG_FILE).write_bytes((folder / CONFIG_FILE).read_bytes())
        _bf16_weights(folder / WEIGHTS_FILE, work / HEAD_DIR / WEIGHTS_FILE)
        files = {
            f"{HEAD_DIR}/{name}": file_sha256(work / HEAD_DIR / name)
            for name in (CONFIG_FILE, WEIGHTS_FILE)
        }
        shipped = ShippedHead(
            files=files,
            target=dict(cache.target),
            corpus=corpus,
            steps=int(result["steps"]),
            train_seconds=float(result["final"]["train_seconds"]),
            train_tokens=int(result["final"]["train_tokens"]),
            commit=_commit(),
            heldout=score,
        )
        (work / MANIFEST_FILE).write_text(shipped.model_dump_json(indent=2) + "\n")
    return shipped


def verify_shipped_head(folder: Path) -> ShippedHead:
    """``folder``'s manifest, once every file it lists has its recorded sha256; otherwise a
    :class:`ModelSourceError` naming the file and the command that rebuilds the head."""
    manifest_file = folder / MANIFEST_FILE
    try:
        shipped = ShippedHead.model_validate_json(manifest_file.read_text())
    except (OSError, ValidationError) as error:
        raise ModelSourceError(
            f"{manifest_file} is missing or not a shipped head's manifest ({error}); "
            f"rebuild it with `{REBUILD}`"
        ) from None
    for name, expected in sorted(shipped.files.items()):
        path = folder / name
        actual = file_sha256(path) if path.is_file() else "missing"
        if actual != expected:
            raise ModelSourceError(
                f"the shipped head's {name} does not match its checksum ({actual[:12]} != "
                f"{expected[:12]}); rebuild it with `{REBUILD}`"
            )
    return shipped


def shipped_package(folder: Path, out: Path, *, k: int, policy: str) -> tuple[Path, ShippedHead]:
    """The shipped head at ``folder`` as a draft package at ``out`` (family ``head``,
    drafter ``head:head``, its manifest beside it as ``shipped.json``), once every checksum
    holds (:func:`verify_shipped_head`); and that manifest."""
    shipped = verify_shipped_head(folder)
    score = shipped.heldout
    agreement = "n/a" if score.agreement is None else f"{score.agreement:.3f}"
    length = "n/a" if score.mean_accepted_length is None else f"{score.mean_accepted_length:.2f}"
    plan = DraftPlan(DrafterSpec("head", HEAD_DIR), check_policy(policy), k)
    manifest = DraftManifest.of(
        plan,
        description=(
            f"base head shipped at {shipped.commit[:12]}: {shipped.steps} steps on "
            f"{shipped.corpus.tokens} tokens of {shipped.corpus.features_from} features; "
            f"held-out agreement {agreement}, mean accepted length {length} at "
            f"k={score.k}"
        ),
    )
    files = {HEAD_DIR: folder / HEAD_DIR, "shipped.json": folder / MANIFEST_FILE}
    return write_package(out, manifest, files), shipped
