"""The loop's registry steps as plain typed functions: the champion of a hardware target,
registering drafts (a built-in one for a target's first champion), promoting one by hand
and damaging it for the main job's drill, the retrain's mark and its lineage. Prefect
wraps each in :mod:`tasks.loop.registry_tasks`.

The registry keeps hardware targets by name (aliases, tags): these take the resolved
:class:`~serving.hardware.HardwareTarget` and give the registry its ``name``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from registry.client import DraftVersion, Registry
from serving.engine.drafters.kinds import BUILTIN_KINDS
from serving.engine.drafters.package import DraftManifest, write_package
from serving.engine.drafters.plan import DEFAULT_K, DEFAULT_POLICY, DraftPlan
from serving.errors import BadInputError
from serving.hardware import HardwareTarget
from serving.models.head import WEIGHTS_FILE
from tasks.evaluate.ship_head import HEAD_DIR, shipped_package, verify_shipped_head
from tasks.loop import retrain_config, targets
from tasks.loop.learned import Param
from tasks.loop.results import DraftRef
from tasks.train.teacher import target_fingerprint

log = logging.getLogger(__name__)

# What a shipped head's target must share with the served one (not its name: a path).
BASE_HEAD_FIT = ("hidden_size", "vocab_size", "num_hidden_layers", "embedding_digest")


def open_registry() -> Registry:
    return Registry()  # configs/registry.yaml, SPECOPS_MLFLOW_URI overrides


def champion_label(registry: Registry, hardware: HardwareTarget) -> str | None:
    """The label of ``hardware``'s champion, or None."""
    draft = registry.champion(hardware.name)
    return None if draft is None else draft.label


def champion_package(
    registry: Registry, hardware: HardwareTarget, cache: Path
) -> tuple[DraftVersion, Path]:
    """``hardware``'s champion and its package, downloaded into ``cache``;
    :class:`BadInputError` saying how to get one when there is none."""
    name = hardware.name
    draft = registry.champion(name)
    if draft is None:
        raise BadInputError(
            f"no champion on hardware target {name!r}: bootstrap one first with "
            f"`specops loop bootstrap --hardware {name}` (the main job does it too)"
        )
    return draft, registry.download(draft, cache)


def builtin_package(
    drafter: str,
    folder: Path,
    *,
    k: int = DEFAULT_K,
    policy: str = DEFAULT_POLICY,
    family: str = "ngram",
) -> Path:
    """A draft package of a drafter that needs no files (prompt lookup, the n-gram store,
    the target's first layers), ready to register: how a fresh registry gets its first
    champion."""
    plan = DraftPlan.parse(drafter, policy=policy, k=k)
    if plan.drafter.kind not in BUILTIN_KINDS:
        raise BadInputError(
            f"drafter {drafter!r} needs files; bootstrap with one of "
            f"{', '.join(BUILTIN_KINDS)} (e.g. pld:3), or train a draft package "
            "(`specops train-draft`) and register it"
        )
    manifest = DraftManifest.of(plan, family=family, description="built-in drafter")
    return write_package(Path(folder) / drafter.replace(":", "-"), manifest)


def register(
    registry: Registry,
    package: Path,
    family: str,
    *,
    params: dict[str, Param] | None = None,
    tags: dict[str, str] | None = None,
    curves: dict[str, list[tuple[int, float]]] | None = None,
    key: str | None = None,
) -> DraftRef:
    """Register ``package`` as a new version of ``family``. With ``key`` (the retrain's
    ``<hw>/<slot>/<family>``), a version already registered under that key is returned
    instead: a re-run of a crashed retrain registers nothing twice."""
    if key is not None:
        found = registry.find_version(registry.model_name(family), family, run_key=key)
        if found is not None:
            return DraftRef(family=found.family, version=found.version, label=found.label)
        tags = {**(tags or {}), "run_key": key}
    draft = registry.log_draft(
        package,
        family=family,
        params=params,
        tags=tags,
        curves={k: [(int(s), float(v)) for s, v in points] for k, points in (curves or {}).items()},
    )
    return DraftRef(family=draft.family, version=draft.version, label=draft.label)


def register_base_head(registry: Registry, hardware: HardwareTarget, work: Path) -> DraftRef | None:
    """Register ``hardware``'s shipped base head (``configs/retrain.yaml`` ``base_head``)
    as a version of the head family, once per weights file (a bootstrap run again reuses
    it), packaged with the head family's k and policy. None when the target names none, or
    when the loop serves another model than the head was trained on (its shapes or weights
    differ: logged, and the first retrain trains a head from scratch). Its checksums are
    checked first: a changed file is refused with the command that rebuilds it."""
    config = retrain_config.load_retrain_config().target(hardware)
    folder = config.base_head_folder()
    if folder is None:
        return None
    settings = config.family("head")
    shipped = verify_shipped_head(folder)
    serving = target_fingerprint(targets.target_for(hardware).model)
    differ = [
        f"{key} {shipped.target.get(key)} != {serving[key]}"
        for key in BASE_HEAD_FIT
        if shipped.target.get(key) != serving[key]
    ]
    if differ:
        log.warning(
            "the shipped base head %s was trained on another target model (%s): not "
            "registered; the first retrain trains a head from scratch",
            folder,
            ", ".join(differ),
        )
        return None
    package, shipped = shipped_package(
        folder, work / "base-head", k=settings.k, policy=settings.policy
    )
    weights = shipped.files[f"{HEAD_DIR}/{WEIGHTS_FILE}"]
    score = shipped.heldout
    params: dict[str, Param] = {
        "init": "shipped base head",
        "steps": shipped.steps,
        "train_seconds": round(shipped.train_seconds, 1),
        "train_tokens": shipped.train_tokens,
        "corpus_tokens": shipped.corpus.tokens,
        "features_from": shipped.corpus.features_from,
    }
    if score.agreement is not None:
        params["heldout_agreement"] = round(score.agreement, 4)
    if score.mean_accepted_length is not None:
        params[f"heldout_mean_accepted_length_k{score.k}"] = round(score.mean_accepted_length, 3)
    return register(
        registry,
        package,
        "head",
        params=params,
        tags={"shipped_commit": shipped.commit, "shipped_from": str(folder)},
        key=f"{hardware.name}/base-head/{weights[:16]}",
    )


def promote_by_hand(
    registry: Registry, draft: DraftRef, *, hardware: HardwareTarget, reason: str
) -> str:
    """Promote ``draft`` over whatever serves now, as ``specops registry promote`` does
    (it must have been evaluated on ``hardware``); its label."""
    version = registry.get(draft.family, draft.version)
    registry.promote(version, hardware.name, reason=reason)
    return version.label


def displaced_by(
    registry: Registry, draft: DraftRef, *, hardware: HardwareTarget
) -> tuple[str | None, bool]:
    """The champion a hand promotion of ``draft`` displaces on ``hardware``, and whether
    ``draft`` serves already: then (a drill run again after its promotion, say) the one its
    promotion displaced, which is what a rollback restores."""
    current = registry.champion(hardware.name)
    if current is not None and (current.family, current.version) == (draft.family, draft.version):
        previous = registry.previous_champion(hardware.name)
        return (None if previous is None else previous.label), True
    return (None if current is None else current.label), False


def scramble_champion(registry: Registry, hardware: HardwareTarget) -> list[str]:
    """Damage the serving machine's copy of ``hardware``'s champion (the download cache the
    server and the traffic replay load from): its weights permuted in place
    (:func:`tasks.loop.damage.scramble_weights`); the files changed."""
    from serving.models.real import cache_root
    from tasks.loop.damage import scramble_weights

    _, package = champion_package(registry, hardware, cache_root() / "registry")
    return [str(path) for path in scramble_weights(package)]


def record_retrain(
    registry: Registry, hardware: HardwareTarget, slot: str, summary: dict[str, str | list[str]]
) -> str:
    """Mark a retrain on ``hardware`` (the cool-down counts from it)."""
    from registry.history import log_retrain

    return log_retrain(registry, hardware.name, slot, summary)
