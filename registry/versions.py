"""Draft versions: registering a draft package, reading versions back (by number, label,
alias or tag), tagging them, and their files (the package, per-backend exports).

Model: one registered model per draft family (``<prefix>-ngram``, ``<prefix>-head``, ...);
a version is a draft package (:mod:`serving.engine.drafters.package`) logged as a run's artifact.

A draft version carries its lineage: the tags given to :meth:`DraftVersions.log_draft` (data
version, git commit, ...) go on both the run and the model version, and its training
curves are the run's metrics, one point per step.

A registration that fails after its run was created deletes the run, so no half-logged
version is left: a version is only created once all its artifacts are logged.

Per-target artifacts: a version's draft exported to another backend's format
(:mod:`tasks.evaluate.export`) is logged beside its package, under ``exports/<backend>`` of the
same run, and the version is tagged ``export.<backend>`` (promotion on a target served by
that backend needs it: :mod:`registry.promotion`).
"""

from __future__ import annotations

import logging
import math
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.labels import LABEL_PATTERN
from registry.store import RegistryError, RegistryStore, _absent
from serving.atomic import replace_dir
from serving.backends.exports import read_export
from serving.engine.drafters.package import read_manifest
from serving.errors import BadInputError, SpecOpsError

log = logging.getLogger(__name__)

_METRICS_PER_BATCH = 1000  # MLflow's limit per log_batch call


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


class DraftVersions(RegistryStore):
    """The registered models of the draft families and their versions."""

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

    def families(self) -> list[str]:
        prefix = f"{self.config.model_prefix}-"
        with self._store("list the draft families"):
            models = self.client.search_registered_models(filter_string=f"name LIKE '{prefix}%'")
        return sorted(self._family_of(m.name) for m in models)

    # --- registering ------------------------------------------------------------------
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
        points = _curve_metrics(curves or {})
        run_id: str | None = None
        with self._store(f"register a new version of {name}"):
            try:
                with self._run(experiment_id=self.experiment_id, run_name=run_name) as run:
                    run_id = run.info.run_id
                    self._mlflow.log_params(params)
                    if metrics:
                        self._mlflow.log_metrics(metrics)
                    self._mlflow.set_tags({"kind": kind, "family": family, **(tags or {})})
                    for start in range(0, len(points), _METRICS_PER_BATCH):
                        self.client.log_batch(
                            run_id, metrics=points[start : start + _METRICS_PER_BATCH]
                        )
                    self._mlflow.log_artifacts(str(folder), artifact_path=kind)
                    for artifact_name, path in (artifacts or {}).items():
                        self._mlflow.log_artifact(str(path), artifact_path=artifact_name)
                    source = f"{run.info.artifact_uri.rstrip('/')}/{kind}"
                # Only now, every artifact logged, does the version exist.
                self._ensure_model(name, family=family, description=description)
                mv = self.client.create_model_version(
                    name, source=source, run_id=run_id, tags={**(tags or {}), "family": family}
                )
            except BaseException:
                if run_id is not None:
                    self._discard(run_id, name)
                raise
        log.info("registered %s version %s", name, mv.version)
        return self._version(family, mv)

    def _ensure_model(self, name: str, *, family: str, description: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(name)
            return
        except MlflowException as error:
            if not _absent(error):
                raise
        try:
            self.client.create_registered_model(
                name, tags={"family": family}, description=description
            )
        except MlflowException as error:
            if error.error_code != "RESOURCE_ALREADY_EXISTS":  # another replica made it
                raise

    # --- reading ----------------------------------------------------------------------
    def get(self, family: str, version: str | int) -> DraftVersion:
        return self._get(self.model_name(family), family, version)

    def _get(self, name: str, family: str, version: str | int) -> DraftVersion:
        from mlflow.exceptions import MlflowException

        with self._store(f"read {name} version {version}"):
            try:
                return self._version(family, self.client.get_model_version(name, str(version)))
            except MlflowException as error:
                if not _absent(error):
                    raise
        raise RegistryError(f"{name} has no version {str(version)!r}")

    def resolve(self, label: str) -> DraftVersion:
        """The version ``label`` names: ``<family>/<version>`` (``head/3``) or the full
        ``<registered model>/<version>`` (``specops-draft-head/3``)."""
        if not re.fullmatch(LABEL_PATTERN, label):
            raise BadInputError(
                f"{label!r} does not name a draft version; write FAMILY/VERSION (head/3) or "
                f"the full label ({self.config.model_prefix}-head/3)"
            )
        name, version = label.rsplit("/", 1)
        return self.get(self._family_of(name), version)

    def by_alias(self, family: str, alias_name: str) -> DraftVersion | None:
        return self._by_alias(self.model_name(family), family, alias_name)

    def _by_alias(self, name: str, family: str, alias_name: str) -> DraftVersion | None:
        from mlflow.exceptions import MlflowException

        with self._store(f"read alias {alias_name} of {name}"):
            try:
                mv = self.client.get_model_version_by_alias(name, alias_name)
            except MlflowException as error:
                if not _absent(error):
                    raise
                return None
        return self._version(family, mv)

    def find_version(self, name: str, family: str, **tags: str) -> DraftVersion | None:
        """The version of registered model ``name`` whose tags include ``tags`` (the
        oldest, if several), or None: how a re-run finds what its first run registered
        (``run_key``) instead of registering it twice."""
        for key, value in tags.items():
            if not re.fullmatch(r"[A-Za-z0-9_.]+", key) or "'" in value or "\\" in value:
                raise RegistryError(f"cannot search by tag {key}={value!r}")
        query = " and ".join([f"name = '{name}'", *(f"tags.{k} = '{v}'" for k, v in tags.items())])
        with self._store(f"search {name} by {tags}"):
            found = self.client.search_model_versions(query)
        if not found:
            return None
        return self._version(family, min(found, key=lambda mv: int(mv.version)))

    def tag_version(self, draft: DraftVersion, key: str, value: str) -> None:
        """Set tag ``key`` on ``draft``'s model version (a note the loop leaves on it, e.g.
        why the pre-gate did not time it: ``pregate.<target>``)."""
        with self._store(f"tag {draft.label} with {key!r}"):
            self.client.set_model_version_tag(draft.name, draft.version, key, value)

    # --- files: the package, exports -------------------------------------------------
    def log_export(self, draft: DraftVersion, backend: str, folder: str | Path) -> str:
        """Keep ``draft``'s export for ``backend`` in its run; return the artifact URI."""
        read_export(folder)  # a broken export is never logged
        path = f"exports/{backend}"
        uri = f"{draft.source.rsplit('/', 1)[0]}/{path}"
        with self._store(f"log the {backend} export of {draft.label}"):
            self.client.log_artifacts(draft.run_id, str(folder), artifact_path=path)
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

    def _fetch(
        self,
        draft: DraftVersion,
        uri: str,
        folder: Path,
        marker: str,
        check: Callable[[Path], object],
    ) -> Path:
        """Download ``uri`` into a temporary folder, check it, then rename it to ``folder``."""
        from mlflow.artifacts import download_artifacts

        if (folder / marker).is_file():
            return folder
        folder.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{draft.version}."))
        try:
            local = Path(
                download_artifacts(
                    artifact_uri=uri,
                    dst_path=str(scratch),
                    tracking_uri=self.tracking_uri,  # resolves mlflow-artifacts:/ URIs
                    registry_uri=self.registry_uri,
                )
            )
            check(local)
            replace_dir(local, folder)
        except Exception as error:
            if isinstance(error, SpecOpsError):
                raise
            raise RegistryError(f"cannot download {draft.label} from {uri}: {error}") from None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return folder
