"""The validation ledger: which store parts the loop has already validated, and into what.

Validation is incremental (:mod:`tasks.data.incremental`): each run validates only the
parts it has not seen and keeps what it concluded as a *batch* of immutable files in
``<out>/validated/``::

    ledger.json                      the committed state (this module)
    batch-<n>-valid.jsonl            {"source", "record"}: each valid record and its line
    batch-<n>-quarantine.jsonl       {"source", "record", "stage", "reasons"}: rejected rows
    .lock                            held by the run in progress (:func:`exclusive`)

The ledger lists the batches in order, each with its validation summary and the parts it
validated, every part by its path relative to the store, its size, mtime and SHA-256.
Only batches named in the ledger count: a run writes its batch files first and the ledger
last (atomically), so a run killed in between leaves files no ledger names, which the next
run removes before it validates the same parts again - nothing lost, nothing doubled.

Parts are immutable by contract (:mod:`serving.records.store`), so a ledger part that has
changed or disappeared is an error (:class:`ChangedPartError`) naming the part, not
something to skip quietly: its earlier verdicts no longer describe the store. The fix is
to restore the part, or to re-validate everything (``full=True``, or delete the ledger).

The ledger also records the *rules* its verdicts were reached under (known hardware and
workloads, the record schema version, and a digest of the code that decides validity);
when they change, the next run re-validates everything on its own.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from serving.atomic import write_json_atomic
from serving.errors import BadInputError
from serving.records import store
from tasks.data.validation_summary import ValidationSummary

log = logging.getLogger(__name__)

VALIDATED = "validated"  # the ledger's folder, inside the dataset folder
LEDGER = "ledger.json"
LEDGER_FORMAT = 1
_BATCH_FILE = re.compile(r"batch-(\d{5,})-(valid|quarantine)\.jsonl")
_CHUNK = 1 << 20


class ChangedPartError(BadInputError):
    """A part the ledger validated has changed or gone: parts are never modified."""


@dataclass(frozen=True)
class PartStamp:
    """What identifies a part's content: its size and SHA-256 (the mtime only spares
    re-hashing a part whose size and mtime are as recorded)."""

    size: int
    mtime_ns: int
    sha256: str


@dataclass(frozen=True)
class Batch:
    """The parts one run validated, and its :func:`tasks.data.validate.validate_records`
    summary of their rows."""

    number: int
    parts: dict[str, PartStamp]  # store-relative path -> stamp
    summary: ValidationSummary

    @property
    def name(self) -> str:
        return f"batch-{self.number:05d}"


@dataclass(frozen=True)
class Ledger:
    rules: dict
    batches: tuple[Batch, ...] = ()

    def parts(self) -> dict[str, PartStamp]:
        return {key: stamp for batch in self.batches for key, stamp in batch.parts.items()}

    def next_number(self) -> int:
        return max((batch.number for batch in self.batches), default=-1) + 1

    def to_dict(self) -> dict:
        return {
            "format": LEDGER_FORMAT,
            "rules": self.rules,
            "batches": [
                {
                    "number": b.number,
                    "parts": {key: asdict(stamp) for key, stamp in sorted(b.parts.items())},
                    "summary": b.summary.model_dump(mode="json"),
                }
                for b in self.batches
            ],
        }


def folder_of(out_dir: Path) -> Path:
    return Path(out_dir) / VALIDATED


def batch_files(folder: Path, batch: Batch) -> tuple[Path, Path]:
    """The batch's valid and quarantine files."""
    return folder / f"{batch.name}-valid.jsonl", folder / f"{batch.name}-quarantine.jsonl"


# --- the ledger file --------------------------------------------------------------------------


def read_batch_file(path: Path) -> list[dict]:
    """The entries of a batch file the ledger names; a missing one is an error saying how
    to recover (re-validate everything)."""
    if not path.is_file():
        raise BadInputError(
            f"the ledger names {path}, which is missing: re-validate everything "
            "(`specops data validate --full`, or delete the ledger)"
        )
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_ledger(folder: Path) -> Ledger | None:
    """The committed ledger in ``folder``, or None when there is none (a first run)."""
    path = Path(folder) / LEDGER
    if not path.is_file():
        return None
    fix = f"delete {path} (or re-validate with full=True) to validate the whole store again"
    try:
        raw = json.loads(path.read_text())
        found = raw.get("format")
        ledger = Ledger(
            rules=raw["rules"],
            batches=tuple(
                Batch(
                    number=b["number"],
                    parts={key: PartStamp(**stamp) for key, stamp in b["parts"].items()},
                    summary=ValidationSummary.model_validate(b["summary"]),
                )
                for b in raw["batches"]
            ),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise BadInputError(f"cannot read the validation ledger {path}: {error}; {fix}") from None
    if found != LEDGER_FORMAT:
        raise BadInputError(
            f"ledger {path} has format {found!r}, this code reads {LEDGER_FORMAT}: {fix}"
        )
    return ledger


def save_ledger(folder: Path, ledger: Ledger) -> None:
    """Commit ``ledger`` (atomically: a reader, or the next run, sees the old or the new)."""
    write_json_atomic(Path(folder) / LEDGER, ledger.to_dict())


@contextmanager
def exclusive(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s lock for the block: one validation run at a time per dataset
    folder (a second waits). The OS drops the lock when its holder dies, so a killed run
    never blocks the next."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("waiting for the validation run holding %s", folder / ".lock")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def remove_uncommitted(folder: Path, ledger: Ledger | None) -> int:
    """Delete batch files that ``ledger`` does not name (left by a run killed before its
    ledger was written, or superseded by a full re-validation) and hidden temporaries of
    killed writes; return how many. Only under :func:`exclusive`."""
    folder = Path(folder)
    if not folder.is_dir():
        return 0
    committed = {b.number for b in (ledger.batches if ledger else ())}
    removed = 0
    for path in folder.iterdir():
        match = _BATCH_FILE.fullmatch(path.name)
        stale = (match and int(match[1]) not in committed) or (
            path.name.startswith(".") and path.name.endswith(".tmp")
        )
        if stale and path.is_file():
            path.unlink()
            removed += 1
    return removed


# --- parts ------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def stamp(path: Path) -> PartStamp:
    info = path.stat()
    return PartStamp(size=info.st_size, mtime_ns=info.st_mtime_ns, sha256=_sha256(path))


def check_parts(root: Path, ledger: Ledger) -> Ledger:
    """``ledger`` with the mtimes of its parts brought up to date, after checking that
    each part is still there with its recorded size and digest (hashed only when the
    mtime moved); :class:`ChangedPartError` naming the first part that is not."""
    root = Path(root)
    fix = (
        "parts are written once and never modified: restore it (e.g. `dvc checkout data`), "
        "or move it out of the store and re-validate everything (curate(..., full=True), "
        "or delete the ledger)"
    )
    batches = []
    for batch in ledger.batches:
        parts = dict(batch.parts)
        for key, recorded in batch.parts.items():
            path = root / key
            try:
                info = path.stat()
            except FileNotFoundError:
                raise ChangedPartError(
                    f"part {key} (validated in {batch.name}) is gone from {root}: {fix}"
                ) from None
            if info.st_size == recorded.size and info.st_mtime_ns == recorded.mtime_ns:
                continue
            digest = _sha256(path) if info.st_size == recorded.size else None
            if digest != recorded.sha256:
                raise ChangedPartError(
                    f"part {key} under {root} changed since {batch.name} validated it "
                    f"(size {recorded.size} -> {info.st_size}, sha256 "
                    f"{recorded.sha256[:12]}... -> {(digest or 'different')[:12]}...): {fix}"
                )
            parts[key] = replace(recorded, mtime_ns=info.st_mtime_ns)
        batches.append(replace(batch, parts=parts))
    return replace(ledger, batches=tuple(batches))


def unvalidated_parts(root: Path, ledger: Ledger) -> list[Path]:
    """The store's committed parts that no batch of ``ledger`` holds, in store order."""
    done = ledger.parts()
    return [p for p in store.part_files(root) if store.part_key(root, p) not in done]


def with_batch(
    ledger: Ledger,
    parts: Sequence[tuple[str, PartStamp]],
    summary: ValidationSummary,
    *,
    number: int,
) -> Ledger:
    """``ledger`` and one more batch, numbered ``number`` (past every batch whose files may
    still be committed, so that writing it never touches them)."""
    if number < ledger.next_number():
        raise ValueError(
            f"batch number {number} is taken: the next free one is {ledger.next_number()}"
        )
    batch = Batch(number=number, parts=dict(parts), summary=summary)
    return replace(ledger, batches=(*ledger.batches, batch))


def source_order(source: str) -> tuple[str, int]:
    """Sort key of a ``<part>:<line>`` source: store order, lines numerically."""
    part, _, line = source.rpartition(":")
    return part, int(line) if line.isdigit() else -1
