"""The decoding engine: a request loop around :func:`serving.engine.step.speculative_step`.

``SpeculativeDecoder.stream`` validates the request before any model work, prefills the
target, then steps until EOS or the token budget, yielding each token with ``from_draft``.
Statistics and (in detailed mode) the disagreement record are built from the same steps,
by the request's record (:mod:`serving.engine.request`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace

import torch

from serving.engine.constrained import Constraint, ConstraintState
from serving.engine.detailed import new_request_id
from serving.engine.drafters.base import Drafter
from serving.engine.drafters.kinds import DEFAULT_STAGE, stage_of
from serving.engine.features import ContextStats
from serving.engine.metrics import StepRecord
from serving.engine.policy import DraftLengthPolicy, NoDraft
from serving.engine.relaxed import check_lambda
from serving.engine.request import GenerationResult, Request, TokenEvent
from serving.engine.sampling import SamplingParams, make_sampler
from serving.engine.step import DraftedBlock, StepResult, draft_block, settle, speculative_step
from serving.errors import BadInputError
from serving.target import LoadedTarget

MODES = ("fast", "detailed")


class Generation:
    """An iterator of :class:`TokenEvent`; ``result`` is set once it is exhausted."""

    def __init__(self, events: Iterator[TokenEvent]) -> None:
        self._events = events
        self.result: GenerationResult | None = None
        # The request's decoding state, once decoding has begun (a batch steps it itself).
        self.decoding: Decoding | None = None

    def __iter__(self) -> Iterator[TokenEvent]:
        return self

    def __next__(self) -> TokenEvent:
        return next(self._events)

    def close(self) -> None:
        """Stop decoding early (a cancelled request): the drafter's per-request state is
        released and ``result`` holds what was decoded, with stop reason ``cancelled``."""
        close = getattr(self._events, "close", None)
        if close is not None:
            close()

    def run(self) -> GenerationResult:
        for _ in self:
            pass
        assert self.result is not None
        return self.result


class SpeculativeDecoder:
    """Decodes one request at a time with a target, a drafter and a draft-length policy."""

    def __init__(
        self,
        target: LoadedTarget,
        *,
        drafter: Drafter | None = None,
        policy: DraftLengthPolicy | None = None,
        eos_token_ids: Sequence[int] | None = None,
        max_context: int | None = None,
        relax_lambda: float | None = None,
    ) -> None:
        """``eos_token_ids``: where a request stops (default: the target's; ``()`` decodes
        to the token budget). ``max_context``: positions a request may fill (default: the
        target's context limit). ``relax_lambda``: opt-in relaxed verification
        (:mod:`serving.engine.relaxed`), λ in (0, ∞]; ``None`` or ∞ verify exactly (the
        default, and the only lossless mode). Built by
        :func:`serving.engine.build.build_decoder` from a draft plan."""
        self.relax_lambda = check_lambda(relax_lambda)
        self.target = target
        # Every tensor the engine makes for the target goes here (computed once).
        self.device: torch.device = target.device
        self.vocab_size = target.vocab_size
        if drafter is not None:
            drafter.check_compatible(self.vocab_size)
        if drafter is not None and policy is None:
            raise BadInputError("a drafter needs a draft-length policy (e.g. FixedK(4))")
        self.drafter = drafter
        self.policy: DraftLengthPolicy = (
            policy if drafter is not None and policy is not None else NoDraft()
        )
        eos = target.eos_token_ids if eos_token_ids is None else eos_token_ids
        self.eos_token_ids = frozenset(int(t) for t in eos)
        self.max_context = int(max_context or target.context_limit)
        self.stage = stage_of(drafter.kind) if drafter is not None else DEFAULT_STAGE

    def on(self, target: LoadedTarget) -> SpeculativeDecoder:
        """This decoder's drafter, policy and limits over another target (the pre-gate's
        recording of this one: :mod:`tasks.evaluate.pregate`)."""
        other = copy.copy(self)
        other.target, other.device = target, target.device
        return other

    @property
    def relaxed(self) -> bool:
        return self.relax_lambda != float("inf")

    def describe(self) -> dict[str, object]:
        described: dict[str, object] = {
            "drafter": self.drafter.describe() if self.drafter else {"name": "none"},
            "policy": self.policy.describe(),
        }
        if self.relaxed:
            described["relax_lambda"] = self.relax_lambda
        return described

    def validate(self, prompt: Sequence[int], max_new_tokens: int, mode: str) -> list[int]:
        if mode not in MODES:
            raise BadInputError(f"unknown mode {mode!r}; choose one of {MODES}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise BadInputError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
        if max_new_tokens < 1:
            raise BadInputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise BadInputError("the prompt is empty; give at least one token")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise BadInputError(
                f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})"
            )
        if len(prompt) + max_new_tokens > self.max_context:
            raise BadInputError(
                f"prompt of {len(prompt)} tokens + max_new_tokens={max_new_tokens} exceeds the "
                f"model's context of {self.max_context} tokens; shorten the prompt or lower "
                "max_new_tokens"
            )
        return prompt

    def begin(
        self,
        prompt: Sequence[int],
        *,
        max_new_tokens: int = 128,
        sampling: SamplingParams | None = None,
        mode: str = "fast",
        request_id: str | None = None,
        constraint: Constraint | None = None,
    ) -> Decoding:
        """Validate a request (raising :class:`BadInputError`) and return its decoding
        state, not yet prefilled: for a batch to step (:mod:`serving.engine.batch`).
        ``constraint``: a grammar the output must follow (its ``start()`` state is
        stepped along the output; decoding stops once it is finished)."""
        sampling = sampling or SamplingParams()
        if constraint is not None and self.relaxed:
            raise BadInputError("a constrained request cannot use relaxed verification")
        if constraint is not None and constraint.vocab_size != self.vocab_size:
            raise BadInputError(
                f"the constraint covers {constraint.vocab_size} token ids but the target's "
                f"vocabulary has {self.vocab_size}"
            )
        if self.relaxed and not sampling.greedy:
            raise BadInputError(
                f"relaxed verification (λ = {self.relax_lambda}) needs greedy decoding "
                f"(temperature 0), got temperature {sampling.temperature}"
            )
        request = Request(
            prompt=self.validate(prompt, max_new_tokens, mode),
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            detailed=mode == "detailed",
            request_id=request_id or new_request_id(),
        )
        return Decoding(self, request, constraint)

    def stream(self, prompt: Sequence[int], **kwargs) -> Generation:
        """Validate now (raising :class:`BadInputError`), decode lazily while iterated;
        keyword arguments as :meth:`begin`. ``generation.decoding`` is the request's state
        (a batch may step it instead of the iterator)."""
        decoding = self.begin(prompt, **kwargs)
        generation = Generation(iter(()))
        generation.decoding = decoding
        generation._events = self._decode(decoding, generation)
        return generation

    def generate(self, prompt: Sequence[int], **kwargs) -> GenerationResult:
        return self.stream(prompt, **kwargs).run()

    def _decode(self, decoding: Decoding, generation: Generation) -> Iterator[TokenEvent]:
        try:
            with torch.inference_mode():
                decoding.prefill()
            while not decoding.done:
                with torch.inference_mode():
                    events = decoding.step_alone()
                yield from events
        except GeneratorExit:
            # Closed early (a cancelled request): what was decoded so far is still reported.
            generation.result = decoding.finish("cancelled")
            raise
        finally:
            decoding.release()
        generation.result = decoding.finish()


class Decoding:
    """One request's decoding state: prefilled once, then stepped until EOS or its budget.

    Stepped alone (the :class:`Generation` iterator, one target pass per step) or inside a
    batch (:mod:`serving.engine.batch`: one packed pass for many requests); both go through
    the same halves, :func:`serving.engine.step.draft_block` and
    :func:`serving.engine.step.settle`, and the same bookkeeping (:meth:`absorb`), so a
    request's output does not depend on which.
    """

    def __init__(
        self, decoder: SpeculativeDecoder, request: Request, constraint: Constraint | None = None
    ) -> None:
        self.decoder = decoder
        # The grammar's state after the output so far (a constrained request).
        self.constraint: ConstraintState | None = (
            constraint.start() if constraint is not None else None
        )
        self.request = request
        self.device = decoder.device
        self.sampler = make_sampler(request.sampling, device=decoder.device)
        self.tokens = list(request.prompt)
        self.cache = decoder.target.new_cache()
        self.context: ContextStats | None = None
        self.stop_reason: str | None = None  # set once decoding is over
        self.prefill_s = 0.0
        self._started = time.perf_counter()
        self._begun = False  # the drafter has begun this request (prefill ran)
        self._released = False

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    @property
    def drafter(self) -> Drafter | None:
        return self.decoder.drafter

    @property
    def wants_hidden(self) -> bool:
        drafter = self.decoder.drafter
        return drafter is not None and drafter.needs_target_hidden

    def prefill(self) -> None:
        """Feed the prompt (all but its last token) to the target; start the drafter and
        the policy. Call under ``torch.inference_mode()``."""
        decoder, device, tokens = self.decoder, self.device, self.tokens
        self._started = time.perf_counter()
        drafter = decoder.drafter
        want_hidden = self.wants_hidden
        # [len(prompt) - 1, hidden] the target's last hidden states, for drafters that read them
        prompt_hidden = torch.empty(0, decoder.target.hidden_size, device=device)
        if len(tokens) > 1:
            # The cache holds every token but the last, which the first step feeds.
            out = decoder.target(
                input_ids=torch.tensor(tokens[:-1], dtype=torch.int64, device=device)[None],
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=1,
                output_hidden_states=want_hidden,
            )
            if want_hidden:
                prompt_hidden = out.hidden_states[-1][0]
        if drafter is not None:
            self._begun = True
            drafter.begin(list(tokens))
            if want_hidden:
                drafter.prefill(prompt_hidden)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the prefill was only queued: time it, not its launch
        self.prefill_s = time.perf_counter() - self._started
        decoder.policy.begin()
        # The target statistics the acceptance features need: kept for detailed records and
        # for drafters that decide with the predictor (the cascade).
        if self.request.detailed or (drafter is not None and drafter.needs_context):
            self.context = ContextStats(len(tokens))

    @property
    def remaining(self) -> int:
        return self.request.max_new_tokens - len(self.request.output)

    def next_k(self) -> int:
        """The policy's draft length, never past the budget: the target's own token always
        comes on top."""
        return max(0, min(self.decoder.policy.next_k(), self.remaining - 1))

    def relax(self) -> tuple[float, float] | None:
        if not self.decoder.relaxed:
            return None
        request = self.request
        passes = max(len(request.steps), 1)
        return (self.decoder.relax_lambda, max(len(request.output) / passes, 1.0))

    def draft(self, k: int) -> DraftedBlock:
        """Up to ``k`` drafts after the output so far, ready for a (packed) target pass."""
        decoder = self.decoder
        return draft_block(
            self.cache,
            self.tokens,
            decoder.drafter,
            k,
            self.sampler,
            device=self.device,
            context=self.context,
            stage=decoder.stage,
            constraint=self.constraint,
        )

    def settle(
        self,
        drafted: DraftedBlock,
        target_logits: torch.Tensor | None,
        *,
        hidden: torch.Tensor | None = None,
        draft_s: float = 0.0,
        verify_s: float = 0.0,
        policy_verify_s: float | None = None,
    ) -> list[TokenEvent]:
        """Verify ``drafted`` against this request's rows of a pass (``None``: the pass
        failed; caches are rewound and nothing is emitted) and take the step in.
        ``policy_verify_s``: what the policy is told the verification cost (a batch tells it
        the pass's cost for this request's rows alone); default ``verify_s``."""
        step = settle(
            drafted,
            target_logits,
            self.cache,
            self.tokens,
            self.decoder.drafter,
            self.sampler,
            hidden=hidden,
            detailed=self.request.detailed,
            context=self.context,
            relax=self.relax(),
        )
        if target_logits is None:
            return []
        return self.absorb(
            replace(step, draft_s=draft_s, verify_s=verify_s), policy_verify_s=policy_verify_s
        )

    def step_alone(self) -> list[TokenEvent]:
        """One step with its own target pass. Call under ``torch.inference_mode()``."""
        decoder = self.decoder
        step = speculative_step(
            decoder.target,
            self.cache,
            self.tokens,
            decoder.drafter,
            self.next_k(),
            self.sampler,
            detailed=self.request.detailed,
            device=self.device,
            context=self.context,
            stage=decoder.stage,
            relax=self.relax(),
            constraint=self.constraint,
        )
        return self.absorb(step)

    def absorb(self, step: StepResult, *, policy_verify_s: float | None = None) -> list[TokenEvent]:
        """Record a verified step: the policy learns, the output grows (cut at EOS and the
        budget), and the step's events come back; sets :attr:`stop_reason` when done."""
        decoder, request = self.decoder, self.request
        decoder.policy.update(
            step.proposed,
            step.agreed,
            draft_s=step.draft_s,
            verify_s=step.verify_s if policy_verify_s is None else policy_verify_s,
        )
        base = len(request.output)
        new_tokens = step.new_tokens
        if self.constraint is not None:
            # The output ends where the grammar completes, even inside a step's tokens.
            for index, token in enumerate(new_tokens):
                self.constraint = self.constraint.advance(token)
                if self.constraint.is_finished():
                    new_tokens = new_tokens[: index + 1]
                    break
        emitted = request.emit(new_tokens, step.accepted, decoder.eos_token_ids)
        if self.context is not None:
            n = len(emitted)
            self.context.observe(step.entropies[:n], step.logprobs[:n], n)
        unverified = {base + i for i in step.unverified if i < len(emitted)}
        request.unverified.extend(sorted(unverified))
        if request.detailed:
            request.record_drafted(step, len(request.steps))
        # Only a rejection inside the emitted tokens is a disagreement of this output:
        # past an EOS among the accepted drafts, position and context would be wrong.
        if step.rejection is not None and step.rejection.draft_index < len(emitted):
            request.record_rejection(self.tokens, step.rejection)
        self.tokens.extend(step.new_tokens)
        request.steps.append(
            StepRecord(
                step.proposed,
                step.accepted,
                len(emitted),
                step.draft_s,
                step.verify_s,
                (step.stage or decoder.stage) if step.proposed else None,
            )
        )
        index = len(request.steps) - 1
        events = [
            TokenEvent(token, from_draft, index, base + offset not in unverified)
            for offset, (token, from_draft) in enumerate(emitted)
        ]
        if emitted and emitted[-1][0] in decoder.eos_token_ids:
            self.stop_reason = "eos"
        elif self.constraint is not None and self.constraint.is_finished():
            self.stop_reason = "eos"  # the grammar is complete
        elif len(request.output) >= request.max_new_tokens:
            self.stop_reason = "length"
        return events

    def release(self) -> None:
        """Free the drafter's per-request state (once; safe to call again)."""
        if not self._released:
            self._released = True
            if self._begun and self.decoder.drafter is not None:
                self.decoder.drafter.end()

    def finish(self, reason: str | None = None) -> GenerationResult:
        """The result so far; ``reason`` ("cancelled", ...) overrides the stop reason."""
        self.release()
        stop_reason = reason or self.stop_reason or "length"
        return self.request.result(
            stop_reason,
            prefill_s=self.prefill_s,
            started=self._started,
            describe=self.decoder.describe,
        )
