"""What the studies that re-run the main job's last retrain evaluation share: its workspace's
registry, its decision (``results/main/loop.json``), and its held-out prompts.

Run after ``bash scripts/main.sh`` from the repository root; ``work`` is the job's
workspace (``.specops/demo``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from serving.errors import BadInputError

REPORT = Path("results/main/loop.json")


def open_workspace(work: Path):
    """The registry of the main job's workspace ``work`` (its own SQLite MLflow store)."""
    if not (work / "mlflow.db").is_file():
        raise BadInputError(
            f"{str(work)!r} holds no mlflow.db: pass the main job's workspace (--work), after "
            "`bash scripts/main.sh`"
        )
    os.environ.setdefault("SPECOPS_MLFLOW_URI", f"sqlite:///{work.resolve()}/mlflow.db")
    os.environ.setdefault("SPECOPS_MLFLOW_ARTIFACTS", str(work.resolve() / "mlartifacts"))
    from registry.client import Registry

    return Registry()


def last_retrain_decision(hint: str = "") -> dict[str, Any]:
    """The decision of the main job's last retrain, as ``loop.json`` keeps it."""
    if not REPORT.is_file():
        raise BadInputError(f"{REPORT} is missing: run `bash scripts/main.sh` first{hint}")
    return json.loads(REPORT.read_text())["flow_result"]["retrained"]["decision"]


def retrain_prompts(work: Path, per_workload: int) -> list:
    """The retrain's evaluation prompts: ``per_workload`` built-in held-out grounded and
    HumanEval prompts, and the workspace's held-out traffic (8 a workload), as the loop
    picks them."""
    from tasks.loop.evaluation_steps import heldout_prompts

    return heldout_prompts(
        ["grounded", "humaneval"],
        per_workload,
        seed=0,
        dataset_dir=work / "dataset",
        traffic_per_workload=8,
    )
