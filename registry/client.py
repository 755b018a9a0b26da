"""The draft registry on MLflow: runs, draft versions, aliases per hardware target,
promotion with a record, rollback. The only module (with its package) that talks to MLflow.

Model: one registered model per draft family (``<prefix>-ngram``, ``<prefix>-head``, ...);
a version is a draft package (:mod:`serving.drafters.package`) logged as a run's artifact.
Aliases are per hardware target: ``challenger-<hw>`` marks the candidate under
evaluation, ``champion-<hw>`` what serves. A promotion may cross families (a head draft
displacing an n-gram drafter), so the alias is first set on the new version and then
removed from the old one; while both exist, the newer ``promoted_at.<hw>`` tag wins, so a
reader never sees a target without a champion, nor a stale one. Promotion refuses a
version that has not been evaluated on that hardware target, and every promotion and
rollback is an MLflow run (experiment ``<experiment>-promotions``) with its reason,
metrics and gate results: the audit trail that rollback reads.

Two flows may promote on the same target at once. Every alias move (promotion, rollback)
holds a file lock per tracking store and hardware target (:func:`promotion_lock_path`), and
re-reads the champion inside it; a promotion given ``expected_champion`` (the champion its
evaluation compared against) is refused when the champion has moved since, so a draft is
never promoted over one it was not measured against. The lock serialises the processes
that share a file system (one machine, or a shared SQLite store); promotions from other
machines against a remote tracking server are checked (compare-and-swap) but not
serialised, and leave a window of a few requests between the check and the move.

A draft version carries its lineage: the tags given to :meth:`Registry.log_draft` (data
version, git commit, ...) go on both the run and the model version, and its training
curves are the run's metrics, one point per step.

The acceptance predictor is registered beside the drafts, as one model outside the draft
prefix with the same per-target aliases (:mod:`registry.predictor`, through this client).

Per-target artifacts: a version's draft exported to another backend's format
(:mod:`tasks.evaluate.export`) is logged beside its package, under ``exports/<backend>`` of the
same run, and the version is tagged ``export.<backend>``. Promotion on a target served by
another backend (``configs/hardware.yaml``) needs that export: what was evaluated there
is exactly what will serve there.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import math
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from registry.config import RegistryConfig, load_registry_config
from serving.atomic import replace_dir
from serving.backends.exports import read_export
from serving.drafters.package import read_manifest
from serving.errors import BadInputError, SpecOpsError
from serving.hardware import hardware_target
from serving.models.real import cache_root

log = logging.getLogger(__name__)

CHAMPION = "champion"
CHALLENGER = "challenger"
LOCK_TIMEOUT_S = 120.0  # a promotion takes well under a second; longer means a stuck holder
_METRICS_PER_BATCH = 1000  # MLflow's limit per log_batch call


# A version as people and files name it: ``<family>/<version>`` or ``<registered model>/<version>``.
LABEL_PATTERN = r"^[A-Za-z0-9_.-]+/[1-9][0-9]*$"


class _AnyChampion(enum.Enum):
    ANY = "any"


ANY_CHAMPION = _AnyChampion.ANY
"""``promote(expected_champion=ANY_CHAMPION)``: promote whatever the champion is now."""
ExpectedChampion = str | None | Literal[_AnyChampion.ANY]


class RegistryError(SpecOpsError, RuntimeError):
    """The registry could not be reached, or refused an operation (the reason says why)."""


def alias(role: str, hardware: str) -> str:
    """``<role>-<hw>``, the alias name; the hardware name is checked (it names a file too)."""
    if role not in (CHAMPION, CHALLENGER):
        raise RegistryError(f"unknown alias role {role!r}; use {CHAMPION!r} or {CHALLENGER!r}")
    if not hardware or not all(c.isalnum() or c in "-_" for c in hardware):
        raise RegistryError(f"hardware target {hardware!r} cannot name an alias")
    return f"{role}-{hardware}"


@dataclass(frozen=True)
class DraftVersion:
    family: str
    name: str  # the registered model
    version: str
    run_id: str
    source: str  # artifact URI of the draft package
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.name}/{self.version}"

    def evaluated_on(self, hardware: str) -> bool:
        return bool(self.tags.get(f"evaluated.{hardware}"))


def promotion_lock_path(tracking_uri: str, hardware: str) -> Path:
    """The file lock that serialises alias moves on ``hardware`` in one tracking store:
    beside the database for SQLite, else under ``<specops cache>/locks/`` keyed by the
    store's URI."""
    alias(CHAMPION, hardware)  # a safe file name
    if tracking_uri.startswith("sqlite:///"):
        database = Path(tracking_uri.removeprefix("sqlite:///"))
        return database.with_name(f"{database.name}.promote-{hardware}.lock")
    store = hashlib.sha256(tracking_uri.encode()).hexdigest()[:16]
    return cache_root() / "locks" / f"{store}-promote-{hardware}.lock"


def _shown(label: str | None) -> str:
    return label if label is not None else "none (plain decoding)"


def _curve_metrics(curves: dict[str, Sequence[tuple[int, float]]]) -> list[Any]:
    """MLflow ``Metric`` entities for training curves, checked (a step is an int >= 0, a
    value a finite number) before anything is logged."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    entities = []
    for name, points in curves.items():
        for point in points:
            try:
                step, value = point
            except (TypeError, ValueError):
                raise RegistryError(
                    f"curve {name!r}: {point!r} is not a (step, value) pair"
                ) from None
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise RegistryError(f"curve {name!r}: step {step!r} is not an integer >= 0")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise RegistryError(f"curve {name!r} at step {step}: {value!r} is not a number")
            if not math.isfinite(value):
                raise RegistryError(f"curve {name!r} at step {step}: {value} is not finite")
            entities.append(Metric(name, float(value), now, step))
    return entities


class Registry:
    def __init__(self, config: RegistryConfig | None = None) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        self.config = config or load_registry_config()
        self.tracking_uri = self.config.resolved_tracking_uri()
        self._check_reachable()
        mlflow.set_tracking_uri(self.tracking_uri)
        self._mlflow = mlflow
        self.client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)
        try:
            self.experiment_id = self._experiment(self.config.experiment)
            self.promotions_id = self._experiment(f"{self.config.experiment}-promotions")
        except Exception as error:
            raise RegistryError(
                f"cannot use the MLflow tracking store at {self.tracking_uri!r}: {error}"
            ) from None

    # --- connection -------------------------------------------------------------------
    def _check_reachable(self) -> None:
        uri = self.tracking_uri
        if uri.startswith("sqlite:///"):
            Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            return
        if uri.startswith(("http://", "https://")):
            import httpx

            try:
                httpx.get(uri.rstrip("/") + "/health", timeout=5.0).raise_for_status()
            except httpx.HTTPError as error:
                raise RegistryError(
                    f"the MLflow tracking server at {uri!r} is unreachable ({error}); start "
                    "it, or set SPECOPS_MLFLOW_URI / configs/registry.yaml tracking_uri"
                ) from None

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        location = f"{self.config.resolved_artifact_root().rstrip('/')}/{name}"
        return self.client.create_experiment(name, artifact_location=location)

    # --- versions ---------------------------------------------------------------------
    def model_name(self, family: str) -> str:
        if not family or not all(c.isalnum() or c in "-_" for c in family):
            raise RegistryError(f"draft family {family!r} must be letters, digits, '-' or '_'")
        return f"{self.config.model_prefix}-{family}"

    def _version(self, family: str, mv) -> DraftVersion:
        return DraftVersion(
            family=family,
            name=mv.name,
            version=str(mv.version),
            run_id=mv.run_id or "",
            source=mv.source,
            tags=dict(mv.tags or {}),
        )

    def _family_of(self, name: str) -> str:
        return name.removeprefix(f"{self.config.model_prefix}-")

    def log_draft(
        self,
        package: str | Path,
        *,
        family: str,
        params: dict[str, Any] | None = None,
        metrics: dict[str, float] | None = None,
        tags: dict[str, str] | None = None,
        run_name: str | None = None,
        artifacts: dict[str, Path] | None = None,
        curves: dict[str, Sequence[tuple[int, float]]] | None = None,
    ) -> DraftVersion:
        """Log a draft package as a run's artifact and register it as a new version of its
        family. The package (and every curve) is checked first: a broken package never gets
        a version.

        ``tags`` (lineage: data version, git commit, ...) go on the run and on the model
        version. ``curves`` are training curves, ``name -> [(step, value), ...]``, logged
        as the run's metric histories (plotted by step in the MLflow UI)."""
        package = Path(package)
        manifest = read_manifest(package)
        return self._log_version(
            self.model_name(family),
            package,
            family=family,
            kind="draft",
            params={"family": family, "drafter": manifest.drafter, **(params or {})},
            metrics=metrics,
            tags=tags,
            run_name=run_name or f"draft-{family}",
            artifacts=artifacts,
            curves=curves,
            description=f"specops {family} drafts",
        )

    def _log_version(
        self,
        name: str,
        folder: Path,
        *,
        family: str,
        kind: str,
        params: dict[str, Any],
        metrics: dict[str, float] | None,
        tags: dict[str, str] | None,
        run_name: str,
        artifacts: dict[str, Path] | None,
        curves: dict[str, Sequence[tuple[int, float]]] | None,
        description: str,
    ) -> DraftVersion:
        """A run (experiment ``<experiment>``) holding ``folder`` under ``<kind>/`` with its
        params, metrics, curves and tags, registered as a new version of ``name`` (created
        if need be); ``tags`` go on the version too. The checked ``folder`` of a draft
        package (:meth:`log_draft`) or of an acceptance predictor (:mod:`registry.predictor`)."""
        from mlflow.exceptions import MlflowException

        points = _curve_metrics(curves or {})
        with self._run(experiment_id=self.experiment_id, run_name=run_name) as run:
            self._mlflow.log_params(params)
            if metrics:
                self._mlflow.log_metrics(metrics)
            self._mlflow.set_tags({"kind": kind, "family": family, **(tags or {})})
            for start in range(0, len(points), _METRICS_PER_BATCH):
                self.client.log_batch(
                    run.info.run_id, metrics=points[start : start + _METRICS_PER_BATCH]
                )
            self._mlflow.log_artifacts(str(folder), artifact_path=kind)
            for artifact_name, path in (artifacts or {}).items():
                self._mlflow.log_artifact(str(path), artifact_path=artifact_name)
            source = f"{run.info.artifact_uri.rstrip('/')}/{kind}"
        try:
            self.client.get_registered_model(name)
        except MlflowException:
            self.client.create_registered_model(
                name, tags={"family": family}, description=description
            )
        mv = self.client.create_model_version(
            name, source=source, run_id=run.info.run_id, tags={**(tags or {}), "family": family}
        )
        log.info("registered %s version %s", name, mv.version)
        return self._version(family, mv)

    def get(self, family: str, version: str | int) -> DraftVersion:
        return self._get(self.model_name(family), family, version)

    def _get(self, name: str, family: str, version: str | int) -> DraftVersion:
        from mlflow.exceptions import MlflowException

        try:
            return self._version(family, self.client.get_model_version(name, str(version)))
        except MlflowException:
            raise RegistryError(f"{name} has no version {str(version)!r}") from None

    def resolve(self, label: str) -> DraftVersion:
        """The version ``label`` names: ``<family>/<version>`` (``head/3``) or the full
        ``<registered model>/<version>`` (``specops-draft-head/3``)."""
        if not re.fullmatch(LABEL_PATTERN, label):
            raise BadInputError(
                f"{label!r} does not name a draft version; write FAMILY/VERSION (head/3) or "
                f"the full label ({self.config.model_prefix}-head/3)"
            )
        name, version = label.rsplit("/", 1)
        return self.get(name.removeprefix(f"{self.config.model_prefix}-"), version)

    def by_alias(self, family: str, alias_name: str) -> DraftVersion | None:
        return self._by_alias(self.model_name(family), family, alias_name)

    def _by_alias(self, name: str, family: str, alias_name: str) -> DraftVersion | None:
        from mlflow.exceptions import MlflowException

        try:
            mv = self.client.get_model_version_by_alias(name, alias_name)
        except MlflowException:
            return None
        return self._version(family, mv)

    def families(self) -> list[str]:
        prefix = f"{self.config.model_prefix}-"
        models = self.client.search_registered_models(filter_string=f"name LIKE '{prefix}%'")
        return sorted(self._family_of(m.name) for m in models)

    # --- evaluation -------------------------------------------------------------------
    def log_evaluation(
        self,
        draft: DraftVersion,
        hardware: str,
        metrics: dict[str, float],
        *,
        report: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        artifacts: list[Path] | None = None,
    ) -> str:
        """Record an evaluation of ``draft`` on ``hardware`` (metrics keyed by the target:
        ``<hw>/<metric>``) and mark the version as evaluated there."""
        alias(CHAMPION, hardware)  # checks the name
        with self._run(
            experiment_id=self.experiment_id, run_name=f"evaluate-{draft.family}-{hardware}"
        ) as run:
            self._mlflow.set_tags(
                {
                    "kind": "evaluation",
                    "hardware": hardware,
                    "family": draft.family,
                    "draft": draft.label,
                }
            )
            if params:
                self._mlflow.log_params(params)
            self._mlflow.log_metrics({f"{hardware}/{k}": float(v) for k, v in metrics.items()})
            if report is not None:
                self._mlflow.log_dict(report, f"evaluation-{hardware}.json")
            for path in artifacts or []:
                self._mlflow.log_artifact(str(path))
        self.client.set_model_version_tag(
            draft.name, draft.version, f"evaluated.{hardware}", run.info.run_id
        )
        for key, value in metrics.items():
            self.client.set_model_version_tag(
                draft.name, draft.version, f"{hardware}/{key}", repr(float(value))
            )
        return run.info.run_id

    def log_report(
        self,
        name: str,
        files: list[Path],
        *,
        metrics: dict[str, float] | None = None,
        tags: dict[str, str] | None = None,
    ) -> str:
        """A run holding a report's files (plots, JSON) and headline metrics."""
        with self._run(experiment_id=self.experiment_id, run_name=name) as run:
            self._mlflow.set_tags({"kind": "report", **(tags or {})})
            if metrics:
                self._mlflow.log_metrics(metrics)
            for path in files:
                self._mlflow.log_artifact(str(path))
        return run.info.run_id

    # --- aliases, promotion, rollback -------------------------------------------------
    def set_challenger(self, draft: DraftVersion, hardware: str) -> None:
        self.client.set_registered_model_alias(
            draft.name, alias(CHALLENGER, hardware), draft.version
        )

    def champion(self, hardware: str) -> DraftVersion | None:
        """What serves on ``hardware``: the newest promotion among the families that hold
        ``champion-<hw>`` (during a cross-family promotion two briefly do)."""
        name = alias(CHAMPION, hardware)
        holders = [draft for family in self.families() if (draft := self.by_alias(family, name))]
        if not holders:
            return None
        return max(holders, key=lambda d: float(d.tags.get(f"promoted_at.{hardware}", "0")))

    def promote(
        self,
        draft: DraftVersion,
        hardware: str,
        *,
        reason: str,
        metrics: dict[str, float] | None = None,
        gates: dict[str, Any] | None = None,
        expected_champion: ExpectedChampion = ANY_CHAMPION,
    ) -> str:
        """Make ``draft`` the champion of ``hardware``; return the promotion run's id.

        ``expected_champion`` is the label of the champion the evaluation behind this
        promotion compared against (``None``: there was none); when the champion has moved
        since, the promotion is refused and ``draft`` must be re-evaluated. The default,
        :data:`ANY_CHAMPION`, promotes over whatever serves now. The checks, the audit run
        and the alias move happen under the target's lock (:func:`promotion_lock_path`)."""
        with self._alias_lock(hardware):
            current = self.get(draft.family, draft.version)  # exists, with fresh tags
            if not current.evaluated_on(hardware):
                raise RegistryError(
                    f"{draft.label} has not been evaluated on {hardware!r}; evaluate it there "
                    "before promoting it"
                )
            backend = hardware_target(hardware).backend
            if backend != "transformers" and f"export.{backend}" not in current.tags:
                raise RegistryError(
                    f"{draft.label} has no {backend} export; hardware target {hardware!r} "
                    "serves on that backend, so evaluate the exported draft there first"
                )
            previous = self.champion(hardware)
            found = previous.label if previous else None
            if expected_champion is not ANY_CHAMPION and found != expected_champion:
                raise RegistryError(
                    f"the champion of {hardware!r} moved from {_shown(expected_champion)} to "
                    f"{_shown(found)} since the evaluation that justified promoting "
                    f"{draft.label}; re-evaluate {draft.label} against the new champion"
                )
            run_id = self._audit(
                "promote",
                hardware,
                draft=current,
                previous=previous,
                reason=reason,
                metrics=metrics,
                gates=gates,
            )
            self._point(current, hardware, previous)
        return run_id

    def rollback(self, hardware: str, *, reason: str = "rollback") -> DraftVersion:
        """Give ``champion-<hw>`` back to the version the last promotion displaced."""
        from mlflow.entities import ViewType

        with self._alias_lock(hardware):
            runs = self.client.search_runs(
                [self.promotions_id],
                filter_string=(
                    f"tags.hardware = '{hardware}' and tags.action = 'promote' "
                    "and tags.rolled_back = 'false'"
                ),
                run_view_type=ViewType.ACTIVE_ONLY,
                order_by=["attributes.start_time DESC"],
                max_results=1,
            )
            if not runs:
                raise RegistryError(f"no promotion on {hardware!r} to roll back")
            last = runs[0]
            family, version = (
                last.data.tags.get("previous_family"),
                last.data.tags.get("previous_version"),
            )
            if not family or not version:
                raise RegistryError(
                    f"the last promotion on {hardware!r} had no previous champion to return to"
                )
            target = self.get(family, version)
            current = self.champion(hardware)
            self._audit("rollback", hardware, draft=target, previous=current, reason=reason)
            self._point(target, hardware, current)
            self.client.set_tag(last.info.run_id, "rolled_back", "true")
        return target

    @contextmanager
    def _run(self, **kwargs: Any) -> Iterator[Any]:
        """``mlflow.start_run`` in this registry's store: the fluent API logs to the global
        tracking URI, which another :class:`Registry` (another store) may have moved."""
        self._mlflow.set_tracking_uri(self.tracking_uri)
        with self._mlflow.start_run(**kwargs) as run:
            yield run

    @contextmanager
    def _alias_lock(self, hardware: str) -> Iterator[None]:
        """Hold the lock of ``hardware``'s aliases in this tracking store."""
        from filelock import FileLock, Timeout

        path = promotion_lock_path(self.tracking_uri, hardware)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(path, timeout=LOCK_TIMEOUT_S)
        try:
            lock.acquire()
        except Timeout:
            raise RegistryError(
                f"another promotion on {hardware!r} has held {str(path)!r} for over "
                f"{LOCK_TIMEOUT_S:.0f} s; wait for it to finish, then promote again"
            ) from None
        try:
            yield
        finally:
            lock.release()

    def _point(self, draft: DraftVersion, hardware: str, previous: DraftVersion | None) -> None:
        name = alias(CHAMPION, hardware)
        self.client.set_model_version_tag(
            draft.name, draft.version, f"promoted_at.{hardware}", repr(time.time())
        )
        self.client.set_registered_model_alias(draft.name, name, draft.version)
        if previous is not None and previous.name != draft.name:
            self.client.delete_registered_model_alias(previous.name, name)

    def _audit(
        self,
        action: str,
        hardware: str,
        *,
        draft: DraftVersion,
        previous: DraftVersion | None,
        reason: str,
        metrics: dict[str, float] | None = None,
        gates: dict[str, Any] | None = None,
    ) -> str:
        record = {
            "action": action,
            "hardware": hardware,
            "family": draft.family,
            "version": draft.version,
            "previous_family": previous.family if previous else "",
            "previous_version": previous.version if previous else "",
            "reason": reason,
            "rolled_back": "false",
        }
        with self._run(
            experiment_id=self.promotions_id, run_name=f"{action}-{hardware}-{draft.label}"
        ) as run:
            self._mlflow.set_tags(record)
            if metrics:
                self._mlflow.log_metrics({f"{hardware}/{k}": float(v) for k, v in metrics.items()})
            self._mlflow.log_dict(
                {**record, "metrics": metrics or {}, "gates": gates or {}, "at": time.time()},
                "promotion.json",
            )
        return run.info.run_id

    # --- artifacts --------------------------------------------------------------------
    def log_export(self, draft: DraftVersion, backend: str, folder: str | Path) -> str:
        """Keep ``draft``'s export for ``backend`` in its run; return the artifact URI."""
        read_export(folder)  # a broken export is never logged
        path = f"exports/{backend}"
        self.client.log_artifacts(draft.run_id, str(folder), artifact_path=path)
        uri = f"{draft.source.rsplit('/', 1)[0]}/{path}"
        self.client.set_model_version_tag(draft.name, draft.version, f"export.{backend}", uri)
        return uri

    def download_export(self, draft: DraftVersion, backend: str, cache: str | Path) -> Path:
        """The export of ``draft`` for ``backend`` in a local folder (reused once there)."""
        uri = self.get(draft.family, draft.version).tags.get(f"export.{backend}")
        if uri is None:
            raise RegistryError(f"{draft.label} has no export for backend {backend!r}")
        folder = Path(cache) / draft.name / f"{draft.version}-{draft.run_id}-{backend}"
        return self._fetch(draft, uri, folder, "export.json", read_export)

    def download(self, draft: DraftVersion, cache: str | Path) -> Path:
        """The draft package of ``draft`` in a local folder (a version never changes, so a
        downloaded copy is reused)."""
        # The run id makes the key unique across tracking stores: two stores can both
        # have a "specops-draft-suffix/1", with different contents.
        folder = Path(cache) / draft.name / f"{draft.version}-{draft.run_id}"
        return self._fetch(draft, draft.source, folder, "draft.json", read_manifest)

    def _fetch(self, draft: DraftVersion, uri: str, folder: Path, marker: str, check) -> Path:
        """Download ``uri`` into a temporary folder, check it, then rename it to ``folder``."""
        from mlflow.artifacts import download_artifacts

        if (folder / marker).is_file():
            return folder
        folder.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{draft.version}."))
        try:
            local = Path(download_artifacts(artifact_uri=uri, dst_path=str(scratch)))
            check(local)
            replace_dir(local, folder)
        except Exception as error:
            if isinstance(error, SpecOpsError):
                raise
            raise RegistryError(f"cannot download {draft.label} from {uri}: {error}") from None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return folder
