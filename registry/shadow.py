"""Shadow scores in MLflow: one run per ``collect`` and hardware target, holding what each
registered draft would have accepted on the newest captured traffic
(:mod:`tasks.loop.shadow` computes them; docs/loop.md says how they differ from measured
figures)."""

from __future__ import annotations

from collections.abc import Mapping

from registry.client import Registry, alias

SHADOW = "shadow"


def log_shadow(
    registry: Registry,
    hardware: str,
    metrics: Mapping[str, float],
    *,
    roles: Mapping[str, str],
    skipped: Mapping[str, int],
) -> str:
    """Log a run of shadow scores on ``hardware``: ``metrics`` keyed
    ``<label>/<workload>/<metric>``, ``roles`` (label -> champion, previous champion,
    challenger) as tags, the records left out by reason as metrics; return its id."""
    alias("champion", hardware)  # checks the name
    with registry._store(f"log the shadow scores on {hardware}"):
        mlflow = registry._mlflow
        with registry._run(
            experiment_id=registry.experiment_id, run_name=f"{SHADOW}-{hardware}"
        ) as run:
            mlflow.set_tags(
                {"kind": SHADOW, "hardware": hardware}
                | {f"role/{label}": role for label, role in roles.items()}
            )
            mlflow.log_metrics(
                dict(metrics) | {f"skipped/{reason}": n for reason, n in skipped.items()}
            )
    return run.info.run_id
