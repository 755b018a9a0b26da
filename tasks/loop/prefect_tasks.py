"""The names other packages import from ``tasks.loop.prefect_tasks`` (``specops/loop_cli.py``,
``benchmarks/demo_workspace.py``), where the loop's Prefect tasks were all kept before they
were split by family (``tasks/loop/*_tasks.py``, over the plain steps of
``tasks/loop/*_steps.py``). New code imports :mod:`tasks.loop.registry_steps` and
:mod:`tasks.loop.evaluation_steps`; this module goes once its importers do.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tasks.data.prompts import Prompt
from tasks.evaluate.evaluate import EncodedPrompt
from tasks.loop.evaluation_steps import heldout_prompts
from tasks.loop.registry_steps import open_registry

__all__ = ["_heldout_prompts", "open_registry"]


def _heldout_prompts(
    workloads: Sequence[str], per_workload: int, seed: int, dataset: str | None, traffic_per: int
) -> list[Prompt | EncodedPrompt]:
    """:func:`tasks.loop.evaluation_steps.heldout_prompts`, called as it was here."""
    folder = None if dataset is None else Path(dataset)
    return heldout_prompts(
        workloads, per_workload, seed=seed, dataset_dir=folder, traffic_per_workload=traffic_per
    )
