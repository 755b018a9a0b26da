"""Files cut into parts no bigger than one transfer takes, and joined back with every
checksum checked (the GPU run kit's model, code and data travel this way).

Standard library only: the joining side runs on a bare GPU machine before anything else
of the kit is installed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from serving.errors import BadInputError

PARTS = "parts"
CHUNK = 1 << 20


@dataclass(frozen=True)
class Part:
    path: str  # kit-relative
    bytes: int
    sha256: str


@dataclass(frozen=True)
class SplitFile:
    """One file of the kit as it travels: its parts in order, and the whole's checksum."""

    name: str  # what it is called once joined
    bytes: int
    sha256: str
    parts: tuple[Part, ...]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SplitFile:
        parts = tuple(Part(**part) for part in data["parts"])
        return cls(data["name"], int(data["bytes"]), str(data["sha256"]), parts)


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def split_file(source: str | Path, kit: str | Path, name: str, part_size: int) -> SplitFile:
    """Write ``source`` into ``kit/parts/`` as parts of at most ``part_size`` bytes
    (``name.part000``, ...)."""
    if part_size < 1:
        raise BadInputError(f"part size must be at least 1 byte, got {part_size}")
    source, kit = Path(source), Path(kit)
    folder = kit / PARTS
    folder.mkdir(parents=True, exist_ok=True)
    parts: list[Part] = []
    whole = hashlib.sha256()
    with open(source, "rb") as handle:
        index = 0
        while True:
            block = handle.read(part_size)
            if not block and index:
                break
            whole.update(block)
            path = folder / f"{name}.part{index:03d}"
            path.write_bytes(block)
            parts.append(
                Part(str(path.relative_to(kit)), len(block), hashlib.sha256(block).hexdigest())
            )
            index += 1
            if len(block) < part_size:
                break
    return SplitFile(name, source.stat().st_size, whole.hexdigest(), tuple(parts))


def join_file(kit: str | Path, entry: SplitFile, destination: str | Path) -> Path:
    """Join ``entry``'s parts from ``kit`` into ``destination`` (atomically), checking each
    part and the whole; a missing or damaged part is named."""
    kit, destination = Path(kit), Path(destination)
    joined = destination.is_file() and destination.stat().st_size == entry.bytes
    if joined and sha256_of(destination) == entry.sha256:
        return destination  # joined before: a re-run does nothing
    for part in entry.parts:
        path = kit / part.path
        if not path.is_file():
            raise BadInputError(f"{entry.name}: part {part.path} is missing from {kit}")
        if path.stat().st_size != part.bytes or sha256_of(path) != part.sha256:
            raise BadInputError(
                f"{entry.name}: part {part.path} is damaged (its size or sha256 differs from "
                "the kit's manifest): copy it again"
            )
    destination.parent.mkdir(parents=True, exist_ok=True)
    scratch = destination.with_name(f".{destination.name}.joining")
    with open(scratch, "wb") as out:
        for part in entry.parts:
            with open(kit / part.path, "rb") as handle:
                shutil.copyfileobj(handle, out, CHUNK)
    if sha256_of(scratch) != entry.sha256:
        scratch.unlink()
        raise BadInputError(f"{entry.name}: the joined file's sha256 differs from the manifest")
    os.replace(scratch, destination)
    return destination
