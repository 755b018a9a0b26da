"""The loop's steps as Prefect tasks: each wraps one plain function of ``tasks/`` (tested
without Prefect) with a name, retries where a retry can help (never for an error that a
retry repeats: :func:`retry_transient`), and no result caching (every step reads state
that changes: the store, the registry)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State, TaskRun

from registry.client import Registry
from serving.errors import BadInputError
from serving.hardware import engine_target, hardware_target
from tasks.data.curate import CurateSummary
from tasks.data.dataset import read_part
from tasks.data.prompts import Prompt
from tasks.data.retention import RetentionReport
from tasks.data.traffic import build_workload
from tasks.data.vllm_pairs import Pair
from tasks.evaluate.evaluate import EncodedPrompt, traffic_prompts
from tasks.loop import steps as loop
from tasks.loop.learned import Trained
from tasks.loop.predictor_step import PredictorOutcome
from tasks.loop.results import DraftRef, RegisteredDraft, Replayed
from tasks.loop.shadow import Shadow
from tasks.loop.steps import Decision
from tasks.loop.triggers import ChampionTrigger
from tasks.loop.watch import Watch
from tasks.settings import loop_settings, promotion_limit
from tasks.train.store_teacher import Answered

# How long evaluate-gate-promote waits for its target's promotion slot (another flow holds
# it while it evaluates and promotes on that target).
PROMOTION_WAIT_S = 3 * 3600


def open_registry() -> Registry:
    return Registry()  # configs/registry.yaml, SPECOPS_MLFLOW_URI overrides


def retry_transient(task: object, task_run: TaskRun, state: State) -> bool:
    """Prefect's ``retry_condition_fn``: retry a failed task run unless its error says a
    retry would fail the same way: bad input, or an error marked ``retryable = False``
    (:class:`tasks.data.version.VersionError` when DVC refused the data)."""
    error = state.data
    if isinstance(error, BadInputError):
        return False
    return bool(getattr(error, "retryable", True))


@task(name="replay-traffic", cache_policy=NO_CACHE, retries=1, retry_condition_fn=retry_transient)
def replay_traffic(
    workload: str,
    n: int,
    *,
    hardware: str,
    store: str,
    run_id: str,
    max_new_tokens: int,
    seed: int = 0,
    split: str = "train",
) -> Replayed:
    """Serve ``n`` prompts of ``workload`` with the current champion, detailed mode."""
    registry = open_registry()
    from serving.models.real import cache_root

    # Versions never change: one download cache per machine, shared with the server.
    draft, package = loop.champion_package(registry, hardware, cache_root() / "registry")
    prompts = build_workload(workload, n, seed=seed, split=split)  # type: ignore[arg-type]
    summary = loop.replay_traffic(
        prompts,
        package=package,
        draft_label=draft.label,
        store_root=Path(store),
        run_id=run_id,
        hardware=engine_target(hardware),
        max_new_tokens=max_new_tokens,
    )
    return Replayed(**dict(summary), champion=draft.label)


@task(name="retention", cache_policy=NO_CACHE, retries=1, retry_condition_fn=retry_transient)
def retention(store: str, dataset: str, *, days: float | None, now: float) -> RetentionReport:
    """Remove the store's traffic older than ``days`` (default: ``configs/store.yaml``) and
    the dataset's copies of it, before validation (a retry finishes a killed run)."""
    return loop.retention_step(Path(store), Path(dataset), days=days, now=now)


@task(name="validate", cache_policy=NO_CACHE, retries=1, retry_condition_fn=retry_transient)
def validate(
    store: str, out: str, *, window: int = 50, threshold: float = 0.5, full: bool = False
) -> CurateSummary:
    """Validate the parts new since the last run (all of them with ``full``) and rebuild
    the dataset from every valid record."""
    return loop.validate_store_step(
        Path(store), Path(out), window=window, threshold=threshold, full=full
    )


@task(
    name="version",
    cache_policy=NO_CACHE,
    retries=2,
    retry_condition_fn=retry_transient,
    retry_delay_seconds=5,
)
def version(store: str) -> str | None:
    """The store's new DVC version, pushed; None while nothing was captured (a scheduled
    collect on a fresh deployment finds no store yet)."""
    from prefect import get_run_logger

    from tasks.data.version import version_store

    if not Path(store).is_dir():
        get_run_logger().warning("nothing captured yet: no store at %s to version", store)
        return None
    return version_store(Path(store), remote=loop_settings().dvc_remote)


@task(name="retrain-trigger", cache_policy=NO_CACHE, retries=1, retry_condition_fn=retry_transient)
def retrain_trigger(
    store: str,
    *,
    hardware: str,
    absolute: float,
    now: float,
    window: int = 50,
    cooldown_minutes: float | None = None,
) -> ChampionTrigger:
    """Whether the champion's rolling acceptance on ``hardware``'s traffic wants a retrain,
    relative to what it accepted when evaluated, outside the cool-down. Only the requests
    the current champion served count: after a promotion, the previous champion's records
    say nothing about the new one. On a vLLM target the windows its deployment scraped from
    vLLM's counters count too (:mod:`tasks.data.vllm_acceptance`)."""
    from registry.history import last_retrain
    from tasks.data.acceptance import PooledAcceptance, rolling_acceptance
    from tasks.data.vllm_acceptance import vllm_groups
    from tasks.loop.retrain_config import load_retrain_config
    from tasks.loop.triggers import decide_retrain
    from tasks.train.suffix_index import read_valid_records

    config = load_retrain_config()
    registry = open_registry()
    champion = registry.champion(hardware)
    served = [
        r
        for r in read_valid_records(Path(store), hardware=hardware)
        if champion is None or r.drafter_version == champion.label
    ]
    groups: list[PooledAcceptance] = list(rolling_acceptance(served, window=window))
    if hardware_target(hardware).backend == "vllm":  # vLLM's own counters, scraped
        label = None if champion is None else champion.label
        groups += vllm_groups(Path(store), hardware, champion=label, window=window)
    cooldown = config.cooldown_minutes if cooldown_minutes is None else cooldown_minutes
    trigger = decide_retrain(
        groups,
        hardware=hardware,
        champion_tags=None if champion is None else champion.tags,
        relative=config.relative_threshold,
        absolute=absolute,
        last_retrain_at=last_retrain(registry, hardware),
        cooldown_s=60.0 * cooldown,
        now=now,
    )
    return ChampionTrigger(**dict(trigger), champion=None if champion is None else champion.label)


@task(name="watch-champion", cache_policy=NO_CACHE)
def watch_champion(store: str, *, hardware: str) -> Watch:
    """The watched champion (:mod:`tasks.loop.watch`): judge the champion of ``hardware`` on
    the requests it served (on a vLLM target, also on the windows its deployment scraped
    from vLLM's counters); when it collapsed, restore the previous champion (the judged
    one expected under the target's lock, the displaced version held out of promotion), or
    raise the alarm when there is none to restore."""
    from registry.client import RegistryError
    from tasks.data.vllm_acceptance import vllm_groups
    from tasks.loop.retrain_config import load_retrain_config
    from tasks.loop.watch import judge, judge_scraped
    from tasks.train.suffix_index import read_valid_records

    settings = load_retrain_config().watch
    registry = open_registry()
    champion = registry.champion(hardware)
    if champion is None or not settings.enabled:
        return Watch(champion=None if champion is None else champion.label, collapsed=False,
                     reasons=[])  # fmt: skip
    collapsed, reasons = judge(
        read_valid_records(Path(store), hardware=hardware), hardware=hardware,
        champion=champion.label, champion_tags=champion.tags, settings=settings,
    )  # fmt: skip
    if hardware_target(hardware).backend == "vllm":  # vLLM's own counters, scraped
        scraped = vllm_groups(Path(store), hardware, champion=champion.label,
                              window=settings.newest)  # fmt: skip
        low, lines = judge_scraped(
            scraped[0] if scraped else None, champion=champion.label,
            champion_tags=champion.tags, settings=settings,
        )  # fmt: skip
        collapsed, reasons = collapsed or low, reasons + lines
    if not collapsed:
        return Watch(champion=champion.label, collapsed=False, reasons=reasons)
    reason = "watch: live acceptance collapsed: " + "; ".join(reasons)
    try:
        restored = registry.rollback(
            hardware, reason=reason, expected_champion=champion.label, hold=True
        )
    except RegistryError as error:
        alarm = f"{champion.label} collapsed and was not rolled back: {error}"
        return Watch(champion=champion.label, collapsed=True, reasons=reasons, alarm=alarm)
    return Watch(
        champion=champion.label, collapsed=True, reasons=reasons, rolled_back_to=restored.label
    )


@task(name="promote-by-hand", cache_policy=NO_CACHE)
def promote_by_hand(draft: DraftRef, *, hardware: str, reason: str) -> str:
    """Promote ``draft`` over whatever serves now, as ``specops registry promote`` does
    (it must have been evaluated on ``hardware``); its label."""
    registry = open_registry()
    version = registry.get(draft.family, draft.version)
    registry.promote(version, hardware, reason=reason)
    return version.label


@task(name="drill-displaced", cache_policy=NO_CACHE)
def displaced_by(draft: DraftRef, *, hardware: str) -> tuple[str | None, bool]:
    """The champion a hand promotion of ``draft`` displaces on ``hardware``, and whether
    ``draft`` serves already: then (a drill run again after its promotion, say) the one its
    promotion displaced, which is what a rollback restores."""
    registry = open_registry()
    current = registry.champion(hardware)
    if current is not None and (current.family, current.version) == (draft.family, draft.version):
        previous = registry.previous_champion(hardware)
        return (None if previous is None else previous.label), True
    return (None if current is None else current.label), False


@task(name="scramble-champion", cache_policy=NO_CACHE)
def scramble_champion(hardware: str) -> list[str]:
    """Damage the serving machine's copy of ``hardware``'s champion (the download cache the
    server and the traffic replay load from): its weights permuted in place
    (:func:`tasks.loop.damage.scramble_weights`); the files changed."""
    from serving.models.real import cache_root
    from tasks.loop.damage import scramble_weights

    _, package = loop.champion_package(open_registry(), hardware, cache_root() / "registry")
    return [str(path) for path in scramble_weights(package)]


@task(name="shadow-scores", cache_policy=NO_CACHE)
def shadow_scores(store: str, work: str, *, hardware: str) -> Shadow:
    """Shadow scores (:mod:`tasks.loop.shadow`): the champion, the previous champion and
    the registered challengers of ``hardware`` replayed over the newest captured records,
    logged to MLflow. A failure is logged and returned, never raised: collect goes on."""
    from prefect import get_run_logger

    from registry.shadow import log_shadow
    from tasks.loop.retrain_config import load_retrain_config
    from tasks.loop.shadow import as_metrics
    from tasks.loop.shadow import shadow_scores as score
    from tasks.train.suffix_index import read_valid_records

    settings = load_retrain_config().shadow
    if not settings.enabled:
        return Shadow(hardware=hardware, scores=[], skipped={}, error="shadow.enabled is false")
    try:
        registry = open_registry()
        roles: dict[str, tuple[str, Path, dict[str, str]]] = {}
        champion = registry.champion(hardware)
        previous = registry.previous_champion(hardware)
        cache = Path(work) / "packages"
        for role, drafts in (
            ("champion", [champion]),
            ("previous champion", [previous]),
            ("challenger", registry.challengers(hardware)),
        ):
            for draft in drafts:
                if draft is not None and draft.label not in roles:
                    roles[draft.label] = (role, registry.download(draft, cache), draft.tags)
        if not roles:
            return Shadow(hardware=hardware, scores=[], skipped={})
        target = loop.target_for(engine_target(hardware))
        records = read_valid_records(Path(store), hardware=hardware)
        scores, skipped = score(records, roles, target=target, settings=settings)
        run_id = None
        if scores:
            run_id = log_shadow(
                registry, hardware, as_metrics(scores),
                roles={label: role for label, (role, _, _) in roles.items()}, skipped=skipped,
            )  # fmt: skip
        return Shadow(hardware=hardware, scores=scores, skipped=skipped, run_id=run_id)
    except Exception as error:  # a shadow score is advice: collect goes on without it
        get_run_logger().warning("shadow scores on %s failed: %s", hardware, error)
        return Shadow(hardware=hardware, scores=[], skipped={}, error=str(error))


@task(name="train-suffix", cache_policy=NO_CACHE)
def train_suffix(store: str, dataset: str, out: str, *, hardware: str) -> str:
    """The suffix challenger from ``hardware``'s trainable records (on a vLLM target, plus
    the answers captured in front of its servers)."""
    records = loop.trainable_records(Path(store), Path(dataset), hardware=hardware)
    answers = [pair.output_token_ids for pair in _captured_pairs(store, hardware)]
    return str(loop.train_suffix_challenger([*records, *answers], Path(out), source=store))


def _captured_pairs(store: str | None, hardware: str) -> list[Pair]:
    """The request/response pairs captured in front of ``hardware``'s vLLM servers
    (:mod:`tasks.data.vllm_pairs`); none on other backends or without a store."""
    from prefect import get_run_logger

    from tasks.data.vllm_pairs import read_pairs

    if store is None or hardware_target(hardware).backend != "vllm":
        return []
    pairs, rejected = read_pairs(Path(store), hardware)
    get_run_logger().info(
        "%d pairs captured in front of vLLM join the training data (%d lines skipped)",
        len(pairs),
        len(rejected),
    )
    return pairs


@task(name="train-learned", cache_policy=NO_CACHE, retries=1, retry_condition_fn=retry_transient)
def train_learned(
    dataset: str,
    out: str,
    *,
    hardware: str,
    budgets: dict[str, float] | None = None,
    store: str | None = None,
) -> list[Trained]:
    """The learned challengers of ``configs/retrain.yaml`` for ``hardware``, trained on the
    dataset's training mix in ``out`` (a retry resumes each from its checkpoint). On a vLLM
    target the request/response pairs captured in front of its servers (``store``'s
    ``vllm-pairs/``) join the mix."""
    from tasks.loop.learned import train_learned_challengers
    from tasks.loop.retrain_config import load_retrain_config

    config = load_retrain_config().target(hardware)
    if budgets:
        config = config.with_budgets(budgets)
    if not config.families:
        return []
    from serving.models.real import cache_root

    init_head = loop.head_to_continue(open_registry(), hardware, cache_root() / "registry")
    mix: list[Answered] = [*read_part(dataset, "train_mix"), *_captured_pairs(store, hardware)]
    return train_learned_challengers(mix, Path(out), config, init_head=init_head)


@task(name="retrain-record", cache_policy=NO_CACHE, retries=1, retry_condition_fn=retry_transient)
def record_retrain(hardware: str, slot: str, summary: dict[str, str | list[str]]) -> str:
    """Mark a retrain on ``hardware`` (the cool-down counts from it)."""
    from registry.history import log_retrain

    return log_retrain(open_registry(), hardware, slot, summary)


@task(name="lineage", cache_policy=NO_CACHE)
def lineage(store: str) -> dict[str, str]:
    """The data version and the git commit a retrain's challengers come from."""
    from tasks.loop.lineage import lineage_tags

    return lineage_tags(Path(store))


@task(name="builtin-package", cache_policy=NO_CACHE)
def builtin_package(drafter: str, folder: str, *, k: int, policy: str, family: str) -> str:
    return str(loop.builtin_package(drafter, Path(folder), k=k, policy=policy, family=family))


@task(name="champion", cache_policy=NO_CACHE, retries=1, retry_condition_fn=retry_transient)
def champion(hardware: str) -> str | None:
    """The label of ``hardware``'s champion, or None."""
    draft = open_registry().champion(hardware)
    return None if draft is None else draft.label


@task(name="register", cache_policy=NO_CACHE, retries=1, retry_condition_fn=retry_transient)
def register(
    package: str,
    family: str,
    params: dict[str, str | int | float | None] | None = None,
    tags: dict[str, str] | None = None,
    curves: dict[str, list[tuple[int, float]]] | None = None,
    key: str | None = None,
) -> RegisteredDraft:
    """Register ``package`` as a new version of ``family``. With ``key`` (the retrain's
    ``<hw>/<slot>/<family>``), a version already registered under that key is returned
    instead: a re-run of a crashed retrain registers nothing twice."""
    registry = open_registry()
    if key is not None:
        found = registry.find_version(registry.model_name(family), family, run_key=key)
        if found is not None:
            return RegisteredDraft(family=found.family, version=found.version, label=found.label)
        tags = {**(tags or {}), "run_key": key}
    draft = registry.log_draft(
        package,
        family=family,
        params=params,
        tags=tags,
        curves={k: [(int(s), float(v)) for s, v in points] for k, points in (curves or {}).items()},
    )
    return RegisteredDraft(family=draft.family, version=draft.version, label=draft.label)


def _heldout_prompts(
    workloads: list[str], per_workload: int, seed: int, dataset: str | None, traffic_per: int
) -> list[Prompt | EncodedPrompt]:
    """The evaluation prompts: each built-in workload's held-out prompts and, with a
    ``dataset`` folder, its held-out traffic (``heldout_traffic.jsonl``, never trained on)."""
    prompts: list[Prompt | EncodedPrompt] = [
        p
        for workload in workloads
        for p in build_workload(workload, per_workload, seed=seed, split="heldout")
    ]
    if dataset is not None:
        held = read_part(dataset, "heldout_traffic")
        prompts += traffic_prompts(held, per_workload=traffic_per)
    return prompts


@task(name="evaluate-gate-promote", cache_policy=NO_CACHE)
def evaluate_gate_promote(
    challengers: Sequence[DraftRef],
    *,
    hardware: str,
    workloads: list[str],
    prompts_per_workload: int,
    max_new_tokens: int,
    cache: str,
    promote: bool = True,
    seed: int = 0,
    traffic: str | None = None,
    traffic_per_workload: int = 8,
    lineage: dict[str, str] | None = None,
    pregate: bool = True,
) -> Decision:
    """Evaluate on ``workloads``' held-out prompts and, with ``traffic`` (a dataset folder),
    on its held-out traffic (``heldout_traffic.jsonl``): the newest collected requests,
    never trained on. ``lineage`` (data version, git commit) tags every evaluation run;
    ``pregate`` False times every challenger (:func:`loop.evaluate_and_decide`)."""
    from prefect.concurrency.sync import concurrency

    registry = open_registry()
    drafts = [registry.get(c.family, c.version) for c in challengers]
    prompts = _heldout_prompts(workloads, prompts_per_workload, seed, traffic, traffic_per_workload)
    # One evaluate-and-promote per target at a time, across every machine: the second
    # evaluates against the champion the first left (tasks/ops/prefect_setup.py creates
    # the limit; without it, e.g. on the embedded server, only the registry's lock and its
    # compare-and-swap guard the promotion).
    with concurrency(
        promotion_limit(hardware), occupy=1, timeout_seconds=PROMOTION_WAIT_S, strict=False
    ):
        decision = loop.evaluate_and_decide(
            registry,
            drafts,
            prompts,
            hardware=engine_target(hardware),
            cache=Path(cache),
            max_new_tokens=max_new_tokens,
            promote=promote,
            tags=lineage,
            pregate=pregate,
        )
    return decision


@task(name="retrain-predictor", cache_policy=NO_CACHE)
def retrain_predictor(
    dataset: str,
    out: str,
    *,
    hardware: str,
    workloads: list[str],
    prompts_per_workload: int,
    max_new_tokens: int,
    cache: str,
    tags: dict[str, str] | None = None,
    promote: bool = True,
    seed: int = 0,
    traffic_per_workload: int = 8,
    key: str | None = None,
) -> PredictorOutcome:
    """Train the acceptance predictor on ``dataset``, register it, and promote it if it
    makes the champion draft faster than the current policy (interleaved, same prompts as
    the drafts' evaluation: built-in held-out and the dataset's held-out traffic)."""
    from tasks.loop.predictor_step import retrain_predictor as run

    prompts = _heldout_prompts(workloads, prompts_per_workload, seed, dataset, traffic_per_workload)
    return run(
        open_registry(),
        Path(dataset),
        Path(out),
        prompts,
        hardware=hardware_target(hardware),
        cache=Path(cache),
        max_new_tokens=max_new_tokens,
        tags=tags,
        promote=promote,
        key=key,
    )
