"""What a running server holds: the target, the champion watcher, the scheduler, metrics
and capture; and how one request becomes a decoder and a generation."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from serving.engine.batch.ragged import use_ragged_attention
from serving.engine.build import build_decoder
from serving.engine.cascade.build import build_cascade
from serving.engine.cascade.drafter import CascadeDrafter
from serving.engine.constrained import Constraint
from serving.engine.decoder import Generation
from serving.engine.drafters.base import Drafter
from serving.engine.drafters.factory import build_drafter
from serving.engine.drafters.plan import (
    DEFAULT_K,
    DEFAULT_POLICY,
    CascadePlan,
    DraftPlan,
    Plan,
)
from serving.engine.sampling import SamplingParams
from serving.errors import BadInputError, ModelSourceError
from serving.hardware import HardwareTarget, engine_target
from serving.loader import load_target, set_threads
from serving.security.keys import ApiKeys, check_bind, load_api_keys
from serving.security.redact import Redactor
from serving.server.capture import Capture
from serving.server.champion import (
    ChampionSource,
    ChampionWatcher,
    LocalChampion,
    RegistryChampion,
    StaticChampion,
)
from serving.server.config import ServerConfig
from serving.server.metrics import ServerMetrics
from serving.server.predictor_watch import (
    LocalPredictor,
    PredictorSource,
    PredictorWatcher,
    RegistryPredictor,
)
from serving.server.scheduler import Scheduler
from serving.skeleton.constraint import SkeletonConstraint
from serving.target import LoadedTarget

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@dataclass
class Decode:
    """One request, ready for the scheduler."""

    generation: Generation
    prompt_ids: list[int]
    draft_version: str  # the champion version, or the per-request drafter spec
    detailed: bool


@dataclass
class ServerState:
    config: ServerConfig
    target: LoadedTarget
    watcher: ChampionWatcher
    scheduler: Scheduler
    metrics: ServerMetrics
    capture: Capture
    # The cascade requests get with drafter "cascade" (None: not configured): its plan and
    # its stages built once, and its predictor, swapped by the watcher.
    cascade: tuple[CascadePlan, CascadeDrafter] | None = None
    predictors: PredictorWatcher | None = None
    api_keys: ApiKeys = field(default_factory=lambda: ApiKeys((), ()))
    _skeleton: SkeletonConstraint | None = None
    _skeleton_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        assert self.target.tokenizer is not None  # a served target is loaded with one
        return self.target.tokenizer

    @property
    def max_context(self) -> int:
        return self.target.context_limit

    def skeleton_constraint(self) -> SkeletonConstraint:
        """The skeleton grammar for this tokenizer, built on first use (about a second)."""
        with self._skeleton_lock:
            if self._skeleton is None:
                self._skeleton = SkeletonConstraint(
                    self.tokenizer,
                    vocab_size=self.target.vocab_size,
                    eos_token_ids=list(self.target.eos_token_ids),
                )
            return self._skeleton

    def _cascade(self) -> tuple[CascadePlan, CascadeDrafter, str]:
        """The configured cascade's plan, a fork of its stages driven by the current
        predictor, and the version label its requests are recorded under."""
        if self.cascade is None:
            raise BadInputError(
                "drafter 'cascade' is not configured on this server (serving.yaml: cascade.stages)"
            )
        plan, cascade = self.cascade
        forked = cascade.fork()
        predictor, version = None, None
        if self.predictors is not None:
            predictor, version = self.predictors.current, self.predictors.version
        forked.predictor = predictor
        label = f"cascade:{cascade.name}" + (f"+predictor:{version}" if version else "")
        return plan, forked, label

    def new_decode(
        self,
        prompt_ids: list[int],
        *,
        max_new_tokens: int,
        sampling: SamplingParams,
        drafter: str = "champion",
        policy: str | None = None,
        k: int | None = None,
        relax_lambda: float | None = None,
        constraint: Constraint | None = None,
        capture: bool = True,
    ) -> Decode:
        """Build the request's own decoder (own drafter, policy and caches) and validate it;
        raises :class:`BadInputError` before any model work. ``drafter``: ``champion``,
        ``cascade`` or a drafter spec, resolved to a plan here."""
        plan: Plan
        request_drafter: Drafter | None
        if drafter == "cascade":
            plan, request_drafter, version = self._cascade()
        elif drafter == "champion":
            champion = self.watcher.current
            plan = champion.plan.with_limits(policy=policy, k=k)
            request_drafter, version = champion.new_drafter(), champion.version
        else:
            plan = DraftPlan.parse(drafter, policy=policy or DEFAULT_POLICY, k=k or DEFAULT_K)
            request_drafter, version = build_drafter(plan.drafter, self.target), drafter
        decoder = build_decoder(
            self.target, plan, drafter=request_drafter, relax_lambda=relax_lambda
        )
        # Skeleton-of-thought's inner requests are not captured (their prompts are ours).
        detailed = capture and self.capture.wants()
        generation = decoder.stream(
            prompt_ids,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            mode="detailed" if detailed else "fast",
            constraint=constraint,
        )
        return Decode(generation, list(prompt_ids), version, detailed)


def champion_source(config: ServerConfig, hardware: HardwareTarget) -> ChampionSource:
    champion = config.champion
    if champion.source == "static":
        return StaticChampion(
            DraftPlan.parse(champion.drafter, policy=champion.policy, k=champion.k)
        )
    if champion.source == "local":
        assert champion.path is not None
        return LocalChampion(champion.path)
    from serving.models.real import cache_root

    try:
        return RegistryChampion(
            hardware, cache=cache_root() / "registry", missing=config.champion.missing
        )
    except ImportError as error:
        raise ModelSourceError(
            f"champion.source 'registry' needs MLflow and registry/: {error}"
        ) from None


def server_keys(config: ServerConfig) -> ApiKeys:
    """The API keys the config points at, checked against the bind address: a host beyond
    loopback with no key is refused unless ``security.allow_unauthenticated``."""
    security = config.security
    keys = load_api_keys(env=security.api_key_env, path=security.api_key_file)
    check_bind(config.host, keys, allow_open=security.allow_unauthenticated)
    return keys


def build_state(
    config: ServerConfig, *, target: LoadedTarget | None = None, api_keys: ApiKeys | None = None
) -> ServerState:
    """Load the target and the champion (slow: seconds), build the serving state. The API
    keys are read (:func:`server_keys`) unless given, before anything slow."""
    keys = server_keys(config) if api_keys is None else api_keys
    hardware = engine_target(config.hardware)
    set_threads(config.threads or hardware.threads)
    source = champion_source(config, hardware)  # a bad champion config fails before loading
    if target is None:
        target = load_target(config.target, hardware)
    use_ragged_attention(target.model)  # requests decode in batches: packed passes
    watcher = ChampionWatcher(source, target)
    metrics = ServerMetrics(model_name=config.model_name, hardware=hardware)
    current = watcher.current
    metrics.set_draft(current.version, str(current.plan.drafter), current.evaluated_acceptance)
    capture = Capture(
        root=Path(config.capture.store),
        share=config.capture.share,
        hardware=hardware,
        failure_threshold=config.capture.failure_threshold,
        seed=config.capture.seed,
        replica=config.replica,
        redactor=Redactor(config.capture.redact_patterns) if config.capture.redact else None,
        tokenizer=target.tokenizer,
        on_redacted=lambda counts: metrics.redacted(counts),
        on_dropped=lambda kind, _: metrics.labels(metrics.capture_dropped, reason=kind).inc(),
    )
    cascade, predictors = _serving_cascade(config, target)
    if config.limits.max_tokens >= target.context_limit:
        raise BadInputError(
            f"limits.max_tokens={config.limits.max_tokens} must be below the model's context "
            f"of {target.context_limit} tokens"
        )
    return ServerState(
        config=config,
        target=target,
        watcher=watcher,
        scheduler=Scheduler(
            queue_size=config.limits.queue_size,
            max_active=config.limits.max_active,
            workers=config.limits.workers,
            threads_per_worker=config.threads or hardware.threads,
            target=target,
            batch=hardware.batch_limits(),
            cost=hardware.pass_cost(),
            on_pass=lambda size, tokens: metrics.observe_pass(size=size, tokens=tokens),
        ),
        metrics=metrics,
        capture=capture,
        cascade=cascade,
        predictors=predictors,
        api_keys=keys,
    )


def _serving_cascade(
    config: ServerConfig, target: LoadedTarget
) -> tuple[tuple[CascadePlan, CascadeDrafter] | None, PredictorWatcher | None]:
    """The configured cascade (its stages built once; requests fork it) and its
    predictor watcher. A predictor that does not load at start-up is reported and the
    cascade serves on its running per-stage acceptance until one does."""
    settings = config.cascade
    if settings.stages is None:
        return None, None
    plan = CascadePlan.parse(settings.stages, k=settings.k_max)
    cascade = (plan, build_cascade(plan, target))
    if settings.predictor == "none":
        return cascade, None
    source: PredictorSource
    if settings.predictor == "local":
        assert settings.predictor_path is not None
        source = LocalPredictor(settings.predictor_path)
    else:
        from serving.models.real import cache_root

        source = RegistryPredictor(target.hardware, cache_root() / "registry")
    watcher = PredictorWatcher(source, hardware=target.hardware)
    if watcher.last_error:
        log.error("the cascade serves without a predictor for now: %s", watcher.last_error)
    return cascade, watcher
