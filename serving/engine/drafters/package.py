"""Draft packages: the unit that is trained, registered, promoted and served.

A draft package is a folder with a ``draft.json`` manifest and, for drafters with weights
or an index, the files they load. The manifest names the drafter as a spec
(:mod:`serving.engine.drafters.factory`) whose path, if any, is relative to the package folder,
plus the draft-length policy and its k, so a promoted package says everything serving
needs::

    draft.json      {"format": 1, "drafter": "pld:3", "policy": "cost", "k": 10, ...}
    weights/        (only for model:/head: drafters: the files the spec points at)

A LoRA draft of the target's first N layers (family ``lora``) holds its adapter alone,
merged into the target's own layers when it loads (:mod:`serving.models.lora`): 2.6 MB for
SmolLM2-135M's first 4 layers where its fp32 merge under ``weights/`` took 176 MB
(docs/training.md)::

    draft.json      {"drafter": "lora:adapter", "family": "lora", ...}
    adapter/        adapter_config.json, adapter_model.safetensors, lora_base.json (N)
    train_metrics.json

n-gram drafters have no files: their package is the manifest alone. Packages are written
into a temporary folder and renamed into place, so a reader never sees half of one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serving.atomic import atomic_dir
from serving.engine.drafters.base import Drafter
from serving.engine.drafters.factory import DrafterSpec, build_drafter
from serving.engine.drafters.plan import DEFAULT_K, DEFAULT_POLICY, DraftPlan, in_package
from serving.engine.policy import MAX_DRAFT_TOKENS, POLICIES
from serving.errors import BadInputError, ModelSourceError

if TYPE_CHECKING:  # at run time the builders need it, not the manifest
    from serving.target import LoadedTarget

MANIFEST = "draft.json"


class DraftManifest(BaseModel):
    """``draft.json``: the package's draft plan as stored (``drafter``, ``policy``, ``k``:
    :meth:`DraftPlan.fields`), its registry family and a description."""

    model_config = ConfigDict(extra="forbid")

    format: Literal[1] = 1
    drafter: str = Field(min_length=1)  # a drafter spec; a path argument is package-relative
    policy: str = DEFAULT_POLICY
    k: int = Field(DEFAULT_K, ge=1, le=MAX_DRAFT_TOKENS)
    family: str = ""  # e.g. "ngram", "head", "lora": what kind of draft this is
    description: str = ""

    @classmethod
    def of(cls, plan: DraftPlan, *, family: str | None = None, description: str = "") -> Self:
        """The manifest of ``plan`` (its paths package-relative), registered under
        ``family`` (default: its kind's, :attr:`DrafterKind.family`)."""
        return cls(
            drafter=str(plan.drafter),
            policy=plan.policy,
            k=plan.k,
            family=plan.kind.family if family is None else family,
            description=description,
        )

    def plan(self, folder: Path) -> DraftPlan:
        """The plan with its drafter's paths (a path argument, an n-gram store) resolved
        against ``folder``."""
        return DraftPlan.parse(in_package(self.drafter, folder), policy=self.policy, k=self.k)

    def spec(self, folder: Path) -> DrafterSpec:
        """The drafter spec with its paths resolved against ``folder``."""
        return self.plan(folder).drafter


def read_manifest(folder: str | Path) -> DraftManifest:
    """Read and check a package's manifest (the drafter spec too) without loading weights."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise ModelSourceError(f"{str(folder)!r} is not a draft package: {MANIFEST} is missing")
    try:
        manifest = DraftManifest.model_validate(json.loads(path.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as error:
        raise ModelSourceError(f"draft package {str(folder)!r}: bad {MANIFEST}: {error}") from None
    if manifest.policy not in POLICIES:
        raise ModelSourceError(
            f"draft package {str(folder)!r}: unknown policy {manifest.policy!r}; "
            f"choose one of {POLICIES}"
        )
    try:
        manifest.plan(folder)
    except BadInputError as error:
        raise ModelSourceError(f"draft package {str(folder)!r}: {error}") from None
    return manifest


def write_package(
    folder: str | Path, manifest: DraftManifest, files: dict[str, Path] | None = None
) -> Path:
    """Write a package atomically: ``files`` maps a package-relative name to a file or
    folder to copy in. An existing package at ``folder`` is replaced."""
    folder = Path(folder)
    with atomic_dir(folder) as scratch:
        for name, source in (files or {}).items():
            destination = scratch / name
            destination.parent.mkdir(parents=True, exist_ok=True)
            if Path(source).is_dir():
                shutil.copytree(source, destination)
            else:
                shutil.copy2(source, destination)
        (scratch / MANIFEST).write_text(manifest.model_dump_json(indent=2))
        read_manifest(scratch)  # what we wrote must load
    return folder


def load_package(folder: str | Path, target: LoadedTarget) -> tuple[DraftManifest, Drafter | None]:
    """Read a package and build its drafter against ``target`` (weights loaded once;
    ``Drafter.fork()`` gives more for concurrent requests)."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    return manifest, build_drafter(manifest.spec(folder), target)
