"""Evaluations of draft versions per hardware target, report runs, and a version's lineage.

An evaluation is a run (experiment ``<experiment>``) with the metrics keyed by the target,
``<hw>/<metric>``; the version is tagged with them and, last, ``evaluated.<hw>`` (what
promotion requires: :mod:`registry.promotion`). Evaluation and report runs take lineage
tags (:meth:`Evaluations.log_evaluation`, :meth:`Evaluations.log_report`);
:meth:`Evaluations.lineage` gathers a version's (``specops registry show VERSION``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from registry.promotion import CHAMPION, alias
from registry.store import RegistryStore, _absent
from registry.versions import DraftVersion

LINEAGE_TAGS = ("data_version", "git_commit")


def _lineage_tags(tags: dict[str, str]) -> dict[str, str]:
    """The lineage among ``tags`` (tasks.loop.lineage.lineage_tags): the data version and
    the git commit, those that are there."""
    return {key: tags[key] for key in LINEAGE_TAGS if tags.get(key)}


def _when(millis: int | None) -> str | None:
    """An MLflow timestamp (ms since the epoch) as ISO 8601 UTC."""
    if millis is None:
        return None
    moment = datetime.fromtimestamp(millis / 1000, tz=UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


class Evaluations(RegistryStore):
    """Evaluation and report runs, and the lineage of a draft version."""

    def log_evaluation(
        self,
        draft: DraftVersion,
        hardware: str,
        metrics: dict[str, float],
        *,
        report: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        artifacts: list[Path] | None = None,
        tags: dict[str, str] | None = None,
    ) -> str:
        """Record an evaluation of ``draft`` on ``hardware`` (metrics keyed by the target:
        ``<hw>/<metric>``) and mark the version as evaluated there. ``tags`` (lineage:
        ``data_version``, ``git_commit``) go on the evaluation run.

        The version is marked (``evaluated.<hw>``, pointing at the run) last; if anything
        before fails, the run is deleted and the version stays unmarked."""
        alias(CHAMPION, hardware)  # checks the name
        run_id: str | None = None
        with self._store(f"log the evaluation of {draft.label} on {hardware!r}"):
            try:
                with self._run(
                    experiment_id=self.experiment_id,
                    run_name=f"evaluate-{draft.family}-{hardware}",
                ) as run:
                    run_id = run.info.run_id
                    self._mlflow.set_tags(
                        {
                            **(tags or {}),
                            "kind": "evaluation",
                            "hardware": hardware,
                            "family": draft.family,
                            "draft": draft.label,
                        }
                    )
                    if params:
                        self._mlflow.log_params(params)
                    self._mlflow.log_metrics(
                        {f"{hardware}/{k}": float(v) for k, v in metrics.items()}
                    )
                    if report is not None:
                        self._mlflow.log_dict(report, f"evaluation-{hardware}.json")
                    for path in artifacts or []:
                        self._mlflow.log_artifact(str(path))
                for key, value in metrics.items():
                    self.client.set_model_version_tag(
                        draft.name, draft.version, f"{hardware}/{key}", repr(float(value))
                    )
                self.client.set_model_version_tag(
                    draft.name, draft.version, f"evaluated.{hardware}", run_id
                )
            except BaseException:
                if run_id is not None:
                    self._discard(run_id)
                raise
        return run_id

    def log_report(
        self,
        name: str,
        files: list[Path],
        *,
        metrics: dict[str, float] | None = None,
        tags: dict[str, str] | None = None,
    ) -> str:
        """A run holding a report's files (plots, JSON) and headline metrics; ``tags``
        (lineage: ``data_version``, ``git_commit``, ...) go on the run."""
        with (
            self._store(f"log the report {name!r}"),
            self._run(experiment_id=self.experiment_id, run_name=name) as run,
        ):
            self._mlflow.set_tags({"kind": "report", **(tags or {})})
            if metrics:
                self._mlflow.log_metrics(metrics)
            for path in files:
                self._mlflow.log_artifact(str(path))
        return run.info.run_id

    def lineage(self, draft: DraftVersion) -> dict[str, Any]:
        """Where ``draft`` came from and where it went: its lineage (``data_version``,
        ``git_commit``: the version's tags, else its run's; empty when none was recorded),
        the run that produced it, its evaluation runs per hardware target (each with the
        lineage it was tagged with), the aliases it holds and its promotions (and
        rollbacks to it), oldest first."""
        from mlflow.exceptions import MlflowException

        def run_of(run_id: str) -> dict[str, Any]:
            try:
                run = self.client.get_run(run_id)
            except MlflowException as error:
                if not _absent(error):
                    raise
                return {"run_id": run_id, "found": False, "lineage": {}}
            return {
                "run_id": run_id,
                "found": True,
                "name": run.info.run_name,
                "status": run.info.status,
                "deleted": run.info.lifecycle_stage == "deleted",
                "started": _when(run.info.start_time),
                "lineage": _lineage_tags(run.data.tags),
            }

        with self._store(f"read the lineage of {draft.label}"):
            produced = run_of(draft.run_id) if draft.run_id else None
            evaluated = {
                key.removeprefix("evaluated."): run_of(run_id)
                for key, run_id in sorted(draft.tags.items())
                if key.startswith("evaluated.")
            }
            model = self.client.get_registered_model(draft.name)
            records = self.client.search_runs(
                [self.promotions_id],
                filter_string=(
                    f"tags.family = '{draft.family}' and tags.version = '{draft.version}'"
                ),
                order_by=["attributes.start_time ASC"],
            )
        held = [name for name, at in (model.aliases or {}).items() if str(at) == draft.version]
        promotions = [
            {
                "run_id": record.info.run_id,
                "at": _when(record.info.start_time),
                "action": record.data.tags.get("action", ""),
                "hardware": record.data.tags.get("hardware", ""),
                "previous": (
                    f"{record.data.tags['previous_family']}/{record.data.tags['previous_version']}"
                    if record.data.tags.get("previous_family")
                    else None
                ),
                "reason": record.data.tags.get("reason", ""),
                "rolled_back": record.data.tags.get("rolled_back") == "true",
            }
            for record in records
        ]
        return {
            "label": draft.label,
            "family": draft.family,
            "lineage": _lineage_tags(draft.tags) or (produced or {}).get("lineage", {}),
            "run": produced,
            "evaluations": evaluated,
            "aliases": sorted(held),
            "promotions": promotions,
        }
