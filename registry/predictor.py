"""The acceptance predictor in the registry, through :class:`registry.client.Registry`.

One registered model, ``predictor_model`` of ``configs/registry.yaml`` (``specops-predictor``,
outside the draft prefix: it is never listed as a draft family); a version is a saved
predictor folder (:mod:`serving.engine.predictor`) logged as a run's artifact. A predictor is
trained for one hardware target (its ``predictor.json`` says which) and scored on that
target's held-out traffic when trained, so a version is logged with those metrics keyed
``<target>/<metric>`` (``cpu/auc``, ``cpu/pld/ece``, ...) and marked evaluated there
(tag ``evaluated.<target>``), with its lineage tags (``data_version``, ``git_commit``).

Aliases per hardware target, as for drafts: ``challenger-<target>`` for the candidate,
``champion-<target>`` for what serves. Either is refused for a version trained for another
target; the champion also for a version not evaluated there. Promotion holds the target's
promotion lock, checks ``expected_champion`` like a draft's, and leaves an audit run
(action ``promote-predictor``, which a draft rollback never reads).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from registry.client import (
    ANY_CHAMPION,
    CHALLENGER,
    CHAMPION,
    DraftVersion,
    ExpectedChampion,
    Registry,
    RegistryError,
    alias,
)
from serving.engine.predictor import PREDICTOR_FILE, check_predictor
from serving.hardware import hardware_target

PREDICTOR_FAMILY = "predictor"
PROMOTE_ACTION = "promote-predictor"
# A predictor version has a draft version's fields (family "predictor", name the model).
PredictorVersion = DraftVersion


def predictor_model(registry: Registry) -> str:
    return registry.config.predictor_model


def log_predictor(
    registry: Registry,
    folder: str | Path,
    *,
    metrics: Mapping[str, float],
    params: dict[str, Any] | None = None,
    tags: dict[str, str] | None = None,
    curves: dict[str, Sequence[tuple[int, float]]] | None = None,
    run_name: str | None = None,
) -> PredictorVersion:
    """Register the predictor ``folder`` as a new version, its held-out ``metrics``
    (unprefixed: ``auc``, ``raw/ece``, ``pld/brier``, ...) logged as ``<target>/<metric>``;
    with metrics, the version counts as evaluated on its target. The folder is checked
    first: a broken one never gets a version."""
    folder = Path(folder)
    meta = check_predictor(folder)
    hardware = str(meta.get("hardware"))
    alias(CHAMPION, hardware)  # a target name that can key metrics and aliases
    lineage = {"hardware": hardware, "feature_set": str(meta["feature_set"]), **(tags or {})}
    version = registry._log_version(
        predictor_model(registry),
        folder,
        family=PREDICTOR_FAMILY,
        kind=PREDICTOR_FAMILY,
        params={"hardware": hardware, **(params or {})},
        metrics={f"{hardware}/{k}": float(v) for k, v in metrics.items()},
        tags=lineage,
        run_name=run_name or f"predictor-{hardware}",
        artifacts=None,
        curves=curves,
        description="specops acceptance predictors, one champion per hardware target",
    )
    if metrics:
        client = registry.client
        client.set_model_version_tag(
            version.name, version.version, f"evaluated.{hardware}", version.run_id
        )
        for key, value in metrics.items():
            if "/" not in key:  # the headline numbers; the run keeps every metric
                client.set_model_version_tag(
                    version.name, version.version, f"{hardware}/{key}", repr(float(value))
                )
    return get_predictor(registry, version.version)


def get_predictor(registry: Registry, version: str | int) -> PredictorVersion:
    return registry._get(predictor_model(registry), PREDICTOR_FAMILY, version)


def predictor_by_alias(registry: Registry, role: str, hardware: str) -> PredictorVersion | None:
    """The version holding ``<role>-<hardware>``, or None."""
    return registry._by_alias(predictor_model(registry), PREDICTOR_FAMILY, alias(role, hardware))


def champion_predictor(registry: Registry, hardware: str) -> PredictorVersion | None:
    return predictor_by_alias(registry, CHAMPION, hardware)


def _check_target(version: PredictorVersion, hardware: str) -> None:
    made_for = version.tags.get("hardware")
    if made_for != hardware:
        raise RegistryError(
            f"{version.label} was trained for hardware target {made_for!r}, not "
            f"{hardware!r}; train a predictor for {hardware!r} "
            f"(specops predictor train --hardware {hardware})"
        )


def set_predictor_challenger(registry: Registry, version: PredictorVersion, hardware: str) -> None:
    """Point ``challenger-<hardware>`` at ``version`` (trained for that target)."""
    current = get_predictor(registry, version.version)
    _check_target(current, hardware)
    registry.client.set_registered_model_alias(
        current.name, alias(CHALLENGER, hardware), current.version
    )


def promote_predictor(
    registry: Registry,
    version: PredictorVersion,
    hardware: str,
    *,
    reason: str,
    metrics: dict[str, float] | None = None,
    expected_champion: ExpectedChampion = ANY_CHAMPION,
) -> str:
    """Make ``version`` the predictor champion of ``hardware``; return the audit run's id.
    Refused for a version trained for another target or not evaluated there, and, given
    ``expected_champion`` (a label, or None for none), when the champion moved since."""
    with registry._alias_lock(hardware):
        current = get_predictor(registry, version.version)  # exists, with fresh tags
        _check_target(current, hardware)
        if not current.evaluated_on(hardware):
            raise RegistryError(
                f"{current.label} has not been evaluated on {hardware!r}; register it with "
                "its held-out metrics (specops predictor train --register) first"
            )
        previous = champion_predictor(registry, hardware)
        found = previous.label if previous else None
        if expected_champion is not ANY_CHAMPION and found != expected_champion:
            raise RegistryError(
                f"the predictor champion of {hardware!r} moved from {expected_champion} to "
                f"{found} since the comparison that justified promoting {current.label}; "
                "compare against the new champion"
            )
        run_id = registry._audit(
            PROMOTE_ACTION,
            hardware,
            draft=current,
            previous=previous,
            reason=reason,
            metrics=metrics,
        )
        registry._point(current, hardware, previous)
    return run_id


def download_predictor(registry: Registry, version: PredictorVersion, cache: str | Path) -> Path:
    """The predictor folder of ``version`` in a local folder (checked; reused once there)."""
    folder = Path(cache) / version.name / f"{version.version}-{version.run_id}"
    return registry._fetch(version, version.source, folder, PREDICTOR_FILE, check_predictor)


def download_champion_predictor(
    registry: Registry, hardware: str, cache: str | Path
) -> Path | None:
    """The folder of ``hardware``'s predictor champion, or None when it has none."""
    champion = champion_predictor(registry, hardware)
    if champion is None:
        return None
    folder = download_predictor(registry, champion, cache)
    check_predictor(folder, hardware=hardware_target(hardware))
    return folder
