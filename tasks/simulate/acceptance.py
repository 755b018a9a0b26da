"""Acceptance by position, estimated from collected records, as a scenario's ``drafters``.

The simulator's ``acceptance_by_position[i]`` is **conditional**: the chance draft ``i``
(0-based) is kept given that draft ``i`` was proposed and drafts ``0..i-1`` were kept.
From verification steps ``(proposed, accepted)``:

- ``trials[i]``: steps with ``proposed > i`` and ``accepted >= i`` (draft ``i`` was
  proposed and reached): a step contributes trials to positions ``0..min(accepted,
  proposed - 1)``;
- ``kept[i]``: steps with ``accepted > i``;
- ``acceptance_by_position[i] = kept[i] / trials[i]`` (``None`` where ``trials[i] = 0``).

This differs from ``serving.engine.metrics.acceptance_by_position``, which counts every step that
proposed draft ``i`` whether or not the drafts before it were kept (the unconditional
share). A step that proposed nothing is no trial anywhere (it still counts in
``steps``).

Records are read from a capture store (``<root>/records/hardware=.../*.jsonl``, what the
server's capture and ``specops data collect`` write), a folder of JSONL parts, or one
``.jsonl``/``.json`` file. A stored record (:mod:`serving.records.schema`) names its
drafter as a string (with ``drafter_version``) and carries its ``workload``; an engine
``DetailedRecord`` (:mod:`serving.engine.detailed`) names it in a dict (``drafter["name"]``) and
has no workload, so its steps are grouped per path given. One estimate per (drafter,
workload or path).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict, TypeGuard, cast

import numpy as np
from pydantic import ValidationError

from serving.errors import BadInputError
from serving.records import store
from serving.records.schema import UnknownSchemaVersionError, parse_record


class DrafterSection(TypedDict):
    """One entry of a scenario's ``drafters`` (:class:`tasks.simulate.config.Drafter`
    validates it; the entries left out take its defaults)."""

    name: str
    k: int
    acceptance_by_position: list[float]  # conditional, per position
    draft_s_per_token: NotRequired[float]
    share: NotRequired[float]  # of the sessions
    block_shares: NotRequired[list[float]]  # of steps proposing 0 .. k drafts


class EstimateRecord(TypedDict):
    """An :class:`AcceptanceEstimate` as JSON (its fields, in order)."""

    name: str
    drafter: str
    workload: str | None
    source: str | None
    requests: int
    steps: int
    longest: int
    mean_proposed: float | None
    mean_accepted: float | None
    trials: list[int]
    kept: list[int]
    acceptance_by_position: list[float | None]
    block_shares: list[float]


class DraftersSection(TypedDict):
    """What ``specops simulate acceptance`` prints and writes."""

    drafters: list[DrafterSection]
    evidence: list[EstimateRecord]


@dataclass(frozen=True)
class AcceptanceEstimate:
    """One drafter's acceptance by position, with the counts behind it."""

    name: str  # the drafters-section name: drafter[@version][/workload or /path]
    drafter: str
    workload: str | None  # the records' workload; None for records without one
    source: str | None  # the path the records came from (None: steps handed in)
    requests: int
    steps: int
    longest: int  # most drafts any step proposed
    mean_proposed: float | None
    mean_accepted: float | None
    trials: list[int]  # per position, as in the module docstring
    kept: list[int]
    acceptance_by_position: list[float | None]
    # Share of steps that proposed j = 0 .. longest drafts (an n-gram drafter often
    # proposes fewer than k, or none).
    block_shares: list[float] = field(default_factory=list)

    def drafter_section(
        self, *, k: int | None = None, draft_s_per_token: float = 0.0, share: float = 1.0
    ) -> DrafterSection:
        """The scenario's ``Drafter`` mapping. ``k`` defaults to the longest block
        proposed; a position without trials (or past the longest) gets 0.0, which the
        survival curve has already reached whenever no step got that far with all drafts
        before it kept."""
        k = self.longest if k is None else k
        if k < 0:
            raise BadInputError(f"k must be >= 0, got {k}")
        curve = [0.0 if v is None else v for v in self.acceptance_by_position]
        curve += [0.0] * (k - len(curve))
        section: DrafterSection = {
            "name": self.name,
            "k": k,
            "acceptance_by_position": [round(v, 6) for v in curve],
            "draft_s_per_token": draft_s_per_token,
            "share": share,
        }
        if self.block_shares and k > 0:
            # Blocks longer than k are cut to k, as a draft-length cap cuts them.
            shares = [*self.block_shares[:k], sum(self.block_shares[k:])]
            section["block_shares"] = [round(v, 6) for v in shares]
        return section

    def to_dict(self) -> EstimateRecord:
        return cast(EstimateRecord, asdict(self))  # asdict: the fields, in order


def estimate_steps(
    steps: Iterable[Sequence[int]],
    *,
    name: str,
    drafter: str | None = None,
    workload: str | None = None,
    source: str | None = None,
    requests: int = 0,
) -> AcceptanceEstimate:
    """Estimate from plain ``(proposed, accepted)`` steps (e.g. a benchmark's own)."""
    listed = [tuple(step) for step in steps]
    for step in listed:
        if len(step) != 2 or not 0 <= step[1] <= step[0]:
            raise BadInputError(
                f"{name}: step {list(step)} is not [proposed, accepted] with 0 <= accepted "
                "<= proposed"
            )
    pairs = np.array(listed, dtype=np.int64).reshape(-1, 2)  # [steps, 2]
    proposed, accepted = pairs[:, 0], pairs[:, 1]
    longest = int(proposed.max()) if len(pairs) else 0
    # a step reaches positions 0..min(accepted, proposed - 1): count m = that + 1 of them
    reached = np.where(proposed > 0, np.minimum(accepted, proposed - 1) + 1, 0)
    trials = _at_least(reached, longest)  # trials[i] = #(reached > i)
    kept = _at_least(accepted, longest)  # kept[i] = #(accepted > i)
    return AcceptanceEstimate(
        name=name,
        drafter=drafter or name,
        workload=workload,
        source=source,
        requests=requests,
        steps=len(pairs),
        longest=longest,
        mean_proposed=float(proposed.mean()) if len(pairs) else None,
        mean_accepted=float(accepted.mean()) if len(pairs) else None,
        trials=trials,
        kept=kept,
        acceptance_by_position=[k / t if t else None for k, t in zip(kept, trials, strict=True)],
        block_shares=[
            float(v) for v in np.bincount(proposed, minlength=longest + 1) / max(len(pairs), 1)
        ]
        if len(pairs)
        else [],
    )


def _at_least(counts: np.ndarray, positions: int) -> list[int]:
    """``[#(counts > i) for i in range(positions)]``."""
    histogram = np.bincount(counts, minlength=positions + 1)
    above = histogram[::-1].cumsum()[::-1]  # above[j] = #(counts >= j)
    return [int(v) for v in above[1 : positions + 1]]


@dataclass
class _Group:
    drafter: str
    workload: str | None
    source: str
    requests: int = 0
    steps: list[list[int]] | None = None


def estimate_records(paths: Sequence[str | Path]) -> list[AcceptanceEstimate]:
    """One estimate per (drafter, workload) over the records under ``paths`` (a record
    without a workload: per drafter and path), sorted by name."""
    if not paths:
        raise BadInputError("no records given: pass a capture store, a folder or a file")
    groups: dict[tuple[str, str | None, str | None], _Group] = {}
    for path in paths:
        for drafter, workload, steps in _read(Path(path)):
            key = (drafter, workload, None if workload is not None else str(path))
            group = groups.setdefault(key, _Group(drafter, workload, str(path), steps=[]))
            group.requests += 1
            assert group.steps is not None
            group.steps.extend(steps)
    if not groups:
        raise BadInputError(
            f"no records with steps under {', '.join(map(str, paths))}: give a capture store "
            "(with records/), a folder of JSONL parts or a .jsonl/.json file"
        )
    several_paths = len({g.source for g in groups.values() if g.workload is None}) > 1
    estimates = []
    for group in groups.values():
        name = group.drafter
        if group.workload is not None:
            name += f"/{group.workload}"
        elif several_paths:
            name += f"/{Path(group.source).name}"
        estimates.append(
            estimate_steps(
                group.steps or [],
                name=name,
                drafter=group.drafter,
                workload=group.workload,
                source=group.source,
                requests=group.requests,
            )
        )
    return sorted(estimates, key=lambda e: e.name)


def drafters_section(
    estimates: Sequence[AcceptanceEstimate], *, k: int | None = None, draft_s_per_token: float = 0.0
) -> DraftersSection:
    """``{"drafters": [...], "evidence": [...]}``: the sections to paste into a scenario
    (each drafter's ``share`` of sessions is its share of the requests recorded) and the
    counts behind them."""
    weights = [max(e.requests, 1) for e in estimates]
    total = sum(weights)
    return {
        "drafters": [
            e.drafter_section(k=k, draft_s_per_token=draft_s_per_token, share=weight / total)
            for e, weight in zip(estimates, weights, strict=True)
        ],
        "evidence": [e.to_dict() for e in estimates],
    }


# --- reading records -------------------------------------------------------------------
def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise BadInputError(f"records: {str(path)!r} is neither a file nor a folder")
    if (path / store.RECORDS).is_dir():  # a capture store's root
        return store.part_files(path)
    return sorted(p for p in path.rglob("*.jsonl") if not p.name.startswith("."))


def record_rows(path: Path) -> Iterator[tuple[str, object]]:
    for file in _files(path):
        if file.suffix == ".json":
            try:
                loaded = json.loads(file.read_text())
            except (OSError, ValueError) as error:
                raise BadInputError(f"records: cannot read {str(file)!r}: {error}") from None
            for number, row in enumerate(loaded if isinstance(loaded, list) else [loaded]):
                yield f"{file}[{number}]", row
            continue
        for number, line in store.read_lines(file):
            if isinstance(line, bytes) or not line.strip():
                if isinstance(line, bytes):
                    raise BadInputError(f"records: {file}:{number} is not UTF-8")
                continue
            try:
                yield f"{file}:{number}", json.loads(line)
            except json.JSONDecodeError as error:
                raise BadInputError(f"records: {file}:{number} is not JSON: {error}") from None


def _read(path: Path) -> Iterator[tuple[str, str | None, list[list[int]]]]:
    """``(drafter, workload, steps)`` per record under ``path``."""
    for where, row in record_rows(path):
        if not isinstance(row, dict):
            raise BadInputError(f"records: {where} is not a JSON object")
        if isinstance(row.get("drafter"), dict):  # an engine DetailedRecord
            name = row["drafter"].get("name")
            steps = row.get("steps")
            if not isinstance(name, str) or not name or not _are_steps(steps):
                raise BadInputError(
                    f"records: {where}: a detailed record needs drafter.name and steps "
                    "[[proposed, accepted], ...]"
                )
            yield name, None, steps
            continue
        try:
            record = parse_record(row)
        except (ValidationError, UnknownSchemaVersionError) as error:
            raise BadInputError(f"records: {where} is not a readable record: {error}") from None
        drafter = record.drafter
        if record.drafter_version and record.drafter_version != "builtin":
            drafter += f"@{record.drafter_version}"
        yield drafter, record.workload, record.steps


def _are_steps(steps: object) -> TypeGuard[list[list[int]]]:
    return isinstance(steps, list) and all(
        isinstance(s, list | tuple) and len(s) == 2 and all(type(v) is int for v in s)
        for s in steps
    )
