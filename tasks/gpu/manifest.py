"""``kit.json``: what a GPU run kit holds and how it runs, read on both machines.

Standard library only (plain JSON and dataclasses): on the GPU machine it is read before
the kit's wheels (pydantic among them) are installed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from serving.errors import BadInputError
from tasks.gpu.parts import SplitFile
from tasks.json_types import JsonObject

KIT_FORMAT = 1
MANIFEST = "kit.json"
MIB = 1 << 20
# Brought as wheels where the machine lacks them: pytest for the device tests, and
# pydantic-settings because the tests' conftest resets the registry's settings around each
# test (a bare H200 lacked it: every device test errored at setup).
KIT_PACKAGES = ("pydantic", "pydantic-settings", "typer", "gguf", "pyyaml", "pytest")
# Brought only with teacher data (``--dataset``), for the training there: bitsandbytes for
# the quantised LoRA settings of `cuda` in configs/retrain.yaml. At 41 MiB it is a transfer
# of its own, which a kit that only measures does not need.
TRAINING_PACKAGES = ("bitsandbytes",)


@dataclass(frozen=True)
class KitSettings:
    """How the steps run there (all set when the kit is built)."""

    threads: int = 8
    repeats: int = 30  # profile timings per size (medians kept, with their spread)
    max_n: int = 16
    context: int = 256
    batch_profile: bool = True
    bench_max_new_tokens: int = 128
    bench_prompts: int = 6  # of the bundle's prompts
    train_budget_s: float = 90.0  # per learned family
    retrain: JsonObject = field(default_factory=dict)  # configs/retrain.yaml's target
    command_s: int = 600
    total_s: int = 720
    # What the tests step runs there (pytest ids): the device tests, which run on the GPU
    # where torch sees one (the CPU rehearsal names only GPU-only ones: the suite runs the
    # rest here already).
    tests: tuple[str, ...] = ("tests/serving/test_device.py", "tests/serving/lean/test_graphed.py")


@dataclass(frozen=True)
class KitManifest:
    hardware: str
    created: str
    commit: str
    part_size: int
    model_kind: str  # "gguf" (converted there) or "folder" (a tar of a model folder)
    files: dict[str, SplitFile]  # role -> file: code, model, bundle, teacher, wheel:<name>
    settings: KitSettings
    # The draft packages it carries (the bundle's), contender -> "label: bytes".
    packages: dict[str, str] = field(default_factory=dict)
    format: int = KIT_FORMAT

    def wheels(self) -> list[str]:
        return sorted(role for role in self.files if role.startswith("wheel:"))

    def to_dict(self) -> JsonObject:
        data = asdict(self)
        data["files"] = {role: f.to_dict() for role, f in self.files.items()}
        return data

    @classmethod
    def from_dict(cls, data: JsonObject) -> KitManifest:
        data = dict(data)
        data["files"] = {role: SplitFile.from_dict(f) for role, f in data["files"].items()}
        settings = dict(data["settings"])
        if "tests" in settings:  # a JSON list
            settings["tests"] = tuple(settings["tests"])
        data["settings"] = KitSettings(**settings)
        return cls(**data)


def write_manifest(kit: Path, manifest: KitManifest) -> Path:
    path = Path(kit) / MANIFEST
    path.write_text(json.dumps(manifest.to_dict(), indent=2) + "\n")
    return path


def read_manifest(kit: str | Path) -> KitManifest:
    path = Path(kit) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise BadInputError(f"{kit} is not a GPU run kit: {path} unreadable ({error})") from None
    if not isinstance(data, dict) or data.get("format") != KIT_FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise BadInputError(f"{path} has format {found!r}; this code reads {KIT_FORMAT}")
    try:
        return KitManifest.from_dict(data)
    except (KeyError, TypeError) as error:
        raise BadInputError(f"{path} is malformed: {error}") from None
