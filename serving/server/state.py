"""What a running server holds: the target, the champion watcher, the scheduler, metrics
and capture; and how one request becomes a decoder and a generation."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from serving.batch.ragged import use_ragged_attention
from serving.cascade.build import build_cascade
from serving.cascade.drafter import CascadeDrafter, CascadePolicy
from serving.constrained import Constraint
from serving.drafters.base import Drafter
from serving.drafters.factory import build_drafter, parse_drafter_spec
from serving.engine import Generation, SpeculativeDecoder
from serving.errors import BadInputError, ModelSourceError
from serving.hardware import engine_target
from serving.loader import eos_ids, load_target, set_threads
from serving.policy import DraftLengthPolicy, make_policy
from serving.sampling import SamplingParams
from serving.security.keys import ApiKeys, check_bind, load_api_keys
from serving.security.redact import Redactor
from serving.server.capture import Capture
from serving.server.champion import (
    ChampionSource,
    ChampionWatcher,
    LoadedDraft,
    LocalChampion,
    RegistryChampion,
    StaticChampion,
    load_draft,
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
    target: object
    tokenizer: object
    eos_token_ids: list[int]
    max_context: int
    watcher: ChampionWatcher
    scheduler: Scheduler
    metrics: ServerMetrics
    capture: Capture
    verify_curve: tuple[float, ...] = field(default_factory=tuple)
    # The cascade requests get with drafter "cascade" (None: not configured), and its
    # predictor, swapped by the watcher.
    cascade: CascadeDrafter | None = None
    predictors: PredictorWatcher | None = None
    api_keys: ApiKeys = field(default_factory=lambda: ApiKeys((), ()))
    _skeleton: SkeletonConstraint | None = None
    _skeleton_lock: threading.Lock = field(default_factory=threading.Lock)

    def skeleton_constraint(self) -> SkeletonConstraint:
        """The skeleton grammar for this tokenizer, built on first use (about a second)."""
        with self._skeleton_lock:
            if self._skeleton is None:
                self._skeleton = SkeletonConstraint(
                    self.tokenizer,
                    vocab_size=int(self.target.config.vocab_size),  # type: ignore[attr-defined]
                    eos_token_ids=self.eos_token_ids,
                )
            return self._skeleton

    def _cascade(self) -> tuple[CascadeDrafter, CascadePolicy, str]:
        if self.cascade is None:
            raise BadInputError(
                "drafter 'cascade' is not configured on this server (serving.yaml: cascade.stages)"
            )
        forked = self.cascade.fork()
        predictor, version = None, None
        if self.predictors is not None:
            predictor, version = self.predictors.current, self.predictors.version
        forked.predictor = predictor
        label = f"cascade:{self.cascade.name}" + (f"+predictor:{version}" if version else "")
        return forked, CascadePolicy(forked), label

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
        raises :class:`BadInputError` before any model work."""
        version = drafter
        request_drafter: Drafter | None
        request_policy: DraftLengthPolicy | None
        if drafter == "cascade":
            request_drafter, request_policy, version = self._cascade()
        elif drafter == "champion":
            draft: LoadedDraft = self.watcher.current
            request_drafter = draft.new_drafter()
            request_policy = draft.new_policy(policy=policy, k=k) if request_drafter else None
            version = draft.ref.version
        else:
            request_drafter = build_drafter(parse_drafter_spec(drafter), self.target)
            request_policy = (
                make_policy(policy or "cost", k or 10, verify_curve=self.verify_curve)
                if request_drafter is not None
                else None
            )
        decoder = SpeculativeDecoder(
            self.target,
            drafter=request_drafter,
            policy=request_policy,
            eos_token_ids=self.eos_token_ids,
            max_context=self.max_context,
            relax_lambda=relax_lambda,
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


def champion_source(config: ServerConfig) -> ChampionSource:
    champion = config.champion
    if champion.source == "static":
        return StaticChampion(champion.drafter, policy=champion.policy, k=champion.k)
    if champion.source == "local":
        assert champion.path is not None
        return LocalChampion(champion.path)
    from serving.models.real import cache_root

    try:
        return RegistryChampion(
            config.hardware, cache=cache_root() / "registry", missing=config.champion.missing
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
    config: ServerConfig, *, target=None, tokenizer=None, api_keys: ApiKeys | None = None
) -> ServerState:
    """Load the target and the champion (slow: seconds), build the serving state. The API
    keys are read (:func:`server_keys`) unless given, before anything slow."""
    keys = server_keys(config) if api_keys is None else api_keys
    hardware = engine_target(config.hardware)
    set_threads(config.threads or hardware.threads)
    source = champion_source(config)  # a bad champion config fails before the model loads
    if target is None or tokenizer is None:
        target, tokenizer = load_target(config.target, **hardware.load_options())
    use_ragged_attention(target)  # requests decode in batches: packed passes
    curve = hardware.curve

    def loader(ref) -> LoadedDraft:
        return load_draft(ref, target, tokenizer, verify_curve=curve)

    watcher = ChampionWatcher(source, loader)
    metrics = ServerMetrics(model_name=config.model_name, hardware=config.hardware)
    metrics.set_draft(
        watcher.current.ref.version,
        str(watcher.current.spec),
        watcher.current.ref.evaluated_acceptance,
    )
    capture = Capture(
        root=Path(config.capture.store),
        share=config.capture.share,
        hardware=config.hardware,
        failure_threshold=config.capture.failure_threshold,
        seed=config.capture.seed,
        replica=config.replica,
        redactor=Redactor(config.capture.redact_patterns) if config.capture.redact else None,
        tokenizer=tokenizer,
        on_redacted=lambda counts: metrics.redacted(counts),
        on_dropped=lambda kind, _: metrics.labels(metrics.capture_dropped, reason=kind).inc(),
    )
    cascade, predictors = _serving_cascade(config, target, tokenizer, curve)
    max_context = int(target.config.max_position_embeddings)
    if config.limits.max_tokens >= max_context:
        raise BadInputError(
            f"limits.max_tokens={config.limits.max_tokens} must be below the model's context "
            f"of {max_context} tokens"
        )
    return ServerState(
        config=config,
        target=target,
        tokenizer=tokenizer,
        eos_token_ids=eos_ids(target, tokenizer),
        max_context=max_context,
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
        verify_curve=curve,
        cascade=cascade,
        predictors=predictors,
        api_keys=keys,
    )


def _serving_cascade(
    config: ServerConfig, target, tokenizer, curve: tuple[float, ...]
) -> tuple[CascadeDrafter | None, PredictorWatcher | None]:
    """The configured cascade (its stages built once; requests fork it) and its
    predictor watcher. A predictor that does not load at start-up is reported and the
    cascade serves on its running per-stage acceptance until one does."""
    settings = config.cascade
    if settings.stages is None:
        return None, None
    cascade, _ = build_cascade(
        settings.stages, target, verify_curve=curve, tokenizer=tokenizer, k_max=settings.k_max
    )
    if settings.predictor == "none":
        return cascade, None
    source: PredictorSource
    if settings.predictor == "local":
        assert settings.predictor_path is not None
        source = LocalPredictor(settings.predictor_path)
    else:
        from serving.models.real import cache_root

        source = RegistryPredictor(config.hardware, cache_root() / "registry")
    watcher = PredictorWatcher(source, hardware=config.hardware)
    if watcher.last_error:
        log.error("the cascade serves without a predictor for now: %s", watcher.last_error)
    return cascade, watcher
