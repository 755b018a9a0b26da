"""Validate a store and build the dataset: the "validate" step of the loop, in one function.

Validates the parts of ``store_root`` that no earlier run into ``out_dir`` validated
(``tasks/data/incremental.py``; the verdicts of earlier runs are kept in
``out_dir/validated/``, and ``full=True`` re-validates everything), then writes into
``out_dir``, from every valid record, earlier and new, the training dataset
(``tasks/data/dataset.py``: the training mix, ``eval`` from the held-out split, and
``heldout_traffic``, the newest ``heldout_share`` of each workload's train traffic), the
quarantine (every rejected row with its reasons: nothing is dropped silently) and plot
data, and returns the summary (validation counts, totals and this run's, dataset sizes,
acceptance, rolling acceptance per workload and hardware target); :func:`curate_records`
returns the valid records beside it, already in memory. The dataset files are
rewritten whole and atomically each run, so a re-run after an interruption gives the same
files; one run at a time per ``out_dir`` (a second waits for the first).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from serving.atomic import write_json_atomic, write_jsonl_atomic
from serving.hardware import load_hardware
from serving.records.schema import RequestRecord
from tasks.data import ledger
from tasks.data.acceptance import GroupAcceptance, GroupWindow, rolling_acceptance
from tasks.data.collect import acceptance_by_position
from tasks.data.dataset import (
    DEFAULT_HELDOUT_SHARE,
    build_dataset,
    check_heldout_share,
    write_dataset,
)
from tasks.data.incremental import validate_incrementally
from tasks.data.validation_summary import IncrementalSummary


class CurateSummary(BaseModel):
    """What one validate step did (``summary.json`` of ``specops data validate``, the
    ``validation`` of the loop's flow results)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    validation: IncrementalSummary
    dataset: dict[str, int]  # part -> records
    acceptance_rate: float | None  # pooled over every valid record
    acceptance_by_position: list[float | None]
    rolling_acceptance: list[GroupWindow]  # per (workload, hardware target)
    retrain_wanted: bool  # some group is below the absolute threshold


@dataclass(frozen=True)
class Curated:
    """What :func:`curate_records` leaves in memory besides its summary: every valid record
    (the earlier batches' and this run's, in store order) the dataset was built from."""

    summary: CurateSummary
    valid: list[RequestRecord]


def curate(
    store_root: Path,
    out_dir: Path,
    *,
    failure_share: float = 0.8,
    seed: int = 0,
    heldout_share: float = DEFAULT_HELDOUT_SHARE,
    window: int = 50,
    threshold: float = 0.5,
    plots_dir: Path | None = None,
    full: bool = False,
) -> CurateSummary:
    """The summary of :func:`curate_records` (see the module docstring)."""
    return curate_records(
        store_root,
        out_dir,
        failure_share=failure_share,
        seed=seed,
        heldout_share=heldout_share,
        window=window,
        threshold=threshold,
        plots_dir=plots_dir,
        full=full,
    ).summary


def curate_records(
    store_root: Path,
    out_dir: Path,
    *,
    failure_share: float = 0.8,
    seed: int = 0,
    heldout_share: float = DEFAULT_HELDOUT_SHARE,
    window: int = 50,
    threshold: float = 0.5,
    plots_dir: Path | None = None,
    full: bool = False,
) -> Curated:
    """Validate, write the dataset, the quarantine and (with ``plots_dir``) the plot data,
    and return the summary with the valid records, as the loop's ``collect`` views them
    (:class:`tasks.data.store_view.StoreView`) without reading the store again."""
    check_heldout_share(heldout_share)  # before anything is read or written
    store_root, out_dir = Path(store_root), Path(out_dir)
    known_hardware = sorted(load_hardware().targets)
    with ledger.exclusive(ledger.folder_of(out_dir)):  # one run per dataset at a time
        result = validate_incrementally(
            store_root, out_dir, known_hardware=known_hardware, full=full
        )
        write_jsonl_atomic(out_dir / "quarantine.jsonl", result.quarantined)
        dataset = build_dataset(
            result.valid, failure_share=failure_share, seed=seed, heldout_share=heldout_share
        )
        sizes = write_dataset(dataset, out_dir)
    tracker = rolling_acceptance(result.valid, window=window, threshold=threshold)
    drafted = sum(r.draft_tokens for r in result.valid)
    accepted = sum(r.accepted_tokens for r in result.valid)
    by_position = acceptance_by_position([r.steps for r in result.valid])
    summary = CurateSummary(
        validation=result.summary,
        dataset=sizes,
        acceptance_rate=accepted / drafted if drafted else None,
        acceptance_by_position=by_position,
        rolling_acceptance=[g.window() for g in tracker],
        retrain_wanted=any(g.retrain_wanted for g in tracker),
    )
    if plots_dir is not None:
        _write_plot_data(Path(plots_dir), by_position, tracker)
    return Curated(summary=summary, valid=result.valid)


def _write_plot_data(
    plots_dir: Path, by_position: list[float | None], tracker: list[GroupAcceptance]
) -> None:
    write_json_atomic(
        plots_dir / "acceptance_by_position.json",
        [
            {"position": i + 1, "acceptance": value}
            for i, value in enumerate(by_position)
            if value is not None
        ],
    )
    write_json_atomic(
        plots_dir / "acceptance_by_workload.json",
        [
            {"workload": f"{g.workload}@{g.hardware}", "acceptance": g.acceptance}
            for g in tracker
            if g.acceptance is not None
        ],
    )
