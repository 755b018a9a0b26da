"""What the registry remembers beyond versions and aliases: retrains (the cool-down reads
the last one) and a family's newest version evaluated on a target (what a retrain
continues from when the family holds no champion there)."""

from __future__ import annotations

from typing import Any

from registry.client import ROLLED_BACK, DraftVersion, Registry, RegistryError, alias

RETRAIN = "retrain"


def log_retrain(registry: Registry, hardware: str, slot: str, summary: dict[str, Any]) -> str:
    """A run marking a retrain on ``hardware`` in schedule slot ``slot``; return its id. A
    slot already marked (a re-run of a crashed retrain) keeps its one run."""
    alias("champion", hardware)  # checks the name
    if any(c in slot for c in "'\\"):
        raise RegistryError(f"retrain slot {slot!r} cannot contain quotes or backslashes")
    with registry._store(f"record the retrain on {hardware} in slot {slot}"):
        marked = registry.client.search_runs(
            [registry.experiment_id],
            filter_string=(
                f"tags.kind = '{RETRAIN}' and tags.hardware = '{hardware}' and tags.slot = '{slot}'"
            ),
            max_results=1,
        )
        if marked:
            return marked[0].info.run_id
        mlflow = registry._mlflow
        with registry._run(
            experiment_id=registry.experiment_id, run_name=f"{RETRAIN}-{hardware}-{slot}"
        ) as run:
            mlflow.set_tags({"kind": RETRAIN, "hardware": hardware, "slot": slot})
            mlflow.log_dict(summary, "retrain.json")
    return run.info.run_id


def last_retrain(registry: Registry, hardware: str) -> float | None:
    """When the last retrain on ``hardware`` was logged (unix seconds), or None."""
    runs = registry.client.search_runs(
        [registry.experiment_id],
        filter_string=f"tags.kind = '{RETRAIN}' and tags.hardware = '{hardware}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0].info.start_time / 1000.0 if runs else None


def newest_evaluated(registry: Registry, family: str, hardware: str) -> DraftVersion | None:
    """``family``'s newest version judged on ``hardware`` — evaluated there, or refused by
    the pre-gate there (``pregate.<hw>``: judged by prediction, never timed) — and not
    rolled back there (a retrain never continues from a version the watched champion
    held), or None (also when the family has no registered model yet)."""
    name = registry.model_name(family)
    versions = registry.client.search_model_versions(f"name = '{name}'")
    evaluated = [
        v
        for v in versions
        if (
            (v.tags or {}).get(f"evaluated.{hardware}") or (v.tags or {}).get(f"pregate.{hardware}")
        )
        and f"{ROLLED_BACK}.{hardware}" not in (v.tags or {})
    ]
    if not evaluated:
        return None
    newest = max(evaluated, key=lambda v: int(v.version))
    return registry.get(family, newest.version)
