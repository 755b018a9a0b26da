"""Validate a store and build the dataset: the "validate" step of the loop, in one function.

Reads every committed part of ``store_root``, validates it (``tasks/data/validate.py``), writes
into ``out_dir`` the training dataset (``tasks/data/dataset.py``: the training mix, ``eval``
from the held-out split, and ``heldout_traffic``, the newest ``heldout_share`` of each
workload's train traffic), the quarantine (every rejected row with its reasons: nothing is
dropped silently) and plot data, and returns the summary (validation counts, dataset sizes,
acceptance, rolling acceptance per workload and hardware target). Everything it writes is
derived from the store and rewritten whole and atomically, so a re-run after an
interruption gives the same files.
"""

from __future__ import annotations

from pathlib import Path

from serving.atomic import write_json_atomic, write_jsonl_atomic
from serving.hardware import load_hardware
from serving.records import store
from tasks.data.acceptance import rolling_acceptance
from tasks.data.collect import acceptance_by_position
from tasks.data.dataset import (
    DEFAULT_HELDOUT_SHARE,
    build_dataset,
    check_heldout_share,
    write_dataset,
)
from tasks.data.validate import validate_records


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
) -> dict:
    check_heldout_share(heldout_share)  # before anything is read or written
    store_root, out_dir = Path(store_root), Path(out_dir)
    known_hardware = sorted(load_hardware().targets)
    result = validate_records(store.read_raw(store_root), known_hardware=known_hardware)
    write_jsonl_atomic(out_dir / "quarantine.jsonl", result.quarantined)
    dataset = build_dataset(
        result.valid, failure_share=failure_share, seed=seed, heldout_share=heldout_share
    )
    sizes = write_dataset(dataset, out_dir)
    tracker = rolling_acceptance(result.valid, window=window, threshold=threshold)
    drafted = sum(r["draft_tokens"] for r in result.valid)
    accepted = sum(r["accepted_tokens"] for r in result.valid)
    by_position = acceptance_by_position(result.valid)
    summary = {
        "validation": result.summary,
        "dataset": sizes,
        "acceptance_rate": accepted / drafted if drafted else None,
        "acceptance_by_position": by_position,
        "rolling_acceptance": [
            {k: v for k, v in g.to_dict().items() if k != "series"} for g in tracker
        ],
        "retrain_wanted": any(g.retrain_wanted for g in tracker),
    }
    if plots_dir is not None:
        _write_plot_data(Path(plots_dir), by_position, tracker)
    return summary


def _write_plot_data(plots_dir: Path, by_position, tracker) -> None:
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
