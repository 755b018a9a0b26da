"""The pre-gate: predict each contender's modelled speed before any timed generation, so a
challenger that cannot win is not timed.

Under greedy decoding the target's output on a prompt does not depend on the draft. So
plain decoding runs once per prompt (the evaluation times that run and, with a champion
timed beside the challengers, does not time plain decoding again), and each contender then
decodes the same prompts against :class:`RecordedStep` — the target as recorded: every
pass returns, at each of its positions, logits whose argmax is the recorded next token
(and, for drafters that read the target's features, the hidden states of one
teacher-forced pass over the recorded sequence). The engine, the drafter and its policy
(its drafting cost profiled first, :mod:`tasks.evaluate.costs`) run exactly as they would;
only the target's arithmetic is skipped. An n-gram or suffix contender's steps are then
exactly those of a real run; a head's or a model draft's are its own drafts on the
recorded context (a head reads features from one full pass where a real run reads them
pass by pass, which can round differently). Its steps, priced as the gates price them
(:mod:`tasks.evaluate.modelled`), give a predicted speedup; the loop leaves untimed a
challenger predicted below the champion's by more than ``pregate_margin``
(``configs/gates.yaml``), with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from serving.engine.decoder import SpeculativeDecoder
from serving.errors import SpecOpsError
from serving.lean.cache import Length
from serving.lean.step import LeanOutput
from serving.target import LoadedTarget
from tasks.evaluate.priced import Pricing

log = logging.getLogger(__name__)


class _Length(Length):
    """A cache that is only a length (the recording keeps nothing else)."""

    def __init__(self) -> None:
        self.length = 0


class RecordedStep:
    """The target as recorded on one sequence at a time (see the module docstring), as a
    step of :class:`serving.target.LoadedTarget` (:meth:`~serving.target.LoadedTarget.
    with_step`): :meth:`use` gives it the sequence (prompt and plain output) and, where a
    drafter reads them, that sequence's final hidden states. Every pass returns, at each
    of its positions, logits whose argmax is the recorded next token."""

    cache_type = _Length

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.sequence: list[int] = []
        self.hidden: torch.Tensor | None = None

    def use(self, sequence: Sequence[int], hidden: torch.Tensor | None = None) -> None:
        self.sequence, self.hidden = list(sequence), hidden

    def new_cache(self) -> _Length:
        return _Length()

    def forward(
        self,
        ids: torch.Tensor,
        caches: Sequence[_Length],
        rows: Sequence[int],
        *,
        keep: int = 0,
        want_hidden: bool = False,
    ) -> LeanOutput:
        if len(caches) != 1:
            raise SpecOpsError("the recorded target decodes one sequence a pass")
        (cache,), (count,) = caches, rows
        start = cache.length
        first = start + count - keep if 0 < keep < count else start
        positions = range(first, start + count)
        logits = torch.zeros(len(positions), self.vocab_size, device=self.device)
        if start + 1 > len(self.sequence):
            raise SpecOpsError(
                f"the recorded target was asked past its {len(self.sequence)} recorded tokens"
            )
        for row, position in enumerate(positions):
            # Past the recording: drafts beyond the token budget's end, which a verification
            # block may carry but nothing emits (zeros: any token would do).
            if position + 1 < len(self.sequence):
                logits[row, self.sequence[position + 1]] = 1.0
        hidden = None
        if want_hidden:
            if self.hidden is None:
                raise SpecOpsError("a drafter asked for hidden states none were recorded for")
            hidden = self.hidden[start : start + count]
            if hidden.shape[0] < count:  # likewise past the recording
                pad = hidden.new_zeros(count - hidden.shape[0], hidden.shape[1])
                hidden = torch.cat([hidden, pad])
        cache.length += count
        return LeanOutput(logits=logits, hidden=hidden)


@dataclass(frozen=True)
class Prediction:
    """One contender's predicted modelled speedup over plain decoding on the prompts."""

    speedup: float | None
    tokens: int
    checks: int
    reproduced: int  # prompts whose replayed output equals plain decoding's
    prompts: int
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # of them, accepted


def predict(
    decoders: Mapping[str, SpeculativeDecoder],
    encoded: Sequence[list[int]],
    outputs: Sequence[Sequence[int]],
    *,
    target: LoadedTarget,
    curve: Sequence[float],
    draft_costs: Mapping[str, float],
    prefills: Sequence[float | None] | None = None,
) -> dict[str, Prediction]:
    """Each contender's :class:`Prediction`: every decoder of ``decoders`` decodes each
    prompt of ``encoded`` against the target as recorded — the prompt and plain decoding's
    greedy ``outputs`` for it (the recording) — with its own drafter and policy, for as many
    tokens as plain decoding made, priced with ``curve`` and ``draft_costs``, and each
    prompt's prefill with ``prefills`` (in plain decoding's steps, as the modelled speed
    prices it: :func:`tasks.evaluate.priced.prefill_steps`; None: unpriced)."""
    if len(encoded) != len(outputs):
        raise SpecOpsError(f"{len(encoded)} prompts but {len(outputs)} recorded outputs")
    if prefills is not None and len(prefills) != len(encoded):
        raise SpecOpsError(f"{len(encoded)} prompts but {len(prefills)} prefill costs")
    prefill = [float(p or 0.0) for p in prefills] if prefills is not None else [0.0] * len(encoded)
    recordings = [list(ids) + list(out) for ids, out in zip(encoded, outputs, strict=True)]
    recorded = RecordedStep(target.vocab_size, target.device)
    replayed = target.with_step(recorded)
    pricing = Pricing(curve, 0.0, draft_costs)
    hidden_cache: dict[int, torch.Tensor] = {}
    out: dict[str, Prediction] = {}
    for name, decoder in decoders.items():
        replay = decoder.on(replayed)
        wants_hidden = decoder.drafter is not None and decoder.drafter.needs_target_hidden
        tokens = checks = reproduced = drafted = accepted = 0
        cost = plain_cost = 0.0
        for index, (ids, sequence) in enumerate(zip(encoded, recordings, strict=True)):
            hidden = None
            if wants_hidden:
                if index not in hidden_cache:
                    hidden_cache[index] = _final_hidden(target, sequence)
                hidden = hidden_cache[index]
            recorded.use(sequence, hidden)
            made = len(sequence) - len(ids)  # plain decoding's: EOS or its token budget
            result = replay.generate(list(ids), max_new_tokens=max(made, 1))
            reproduced += result.token_ids == sequence[len(ids) :]
            blocks: dict[int, int] = {}
            for step in result.steps:
                blocks[step.proposed] = blocks.get(step.proposed, 0) + 1
            tokens += len(result.token_ids)
            checks += len(result.steps)
            drafted += sum(step.proposed for step in result.steps)
            accepted += sum(step.accepted for step in result.steps)
            cost += pricing.checks(blocks, name) + prefill[index]
            plain_cost += made + prefill[index]
        # Plain decoding costs one one-token pass a token (and the same prefills): the
        # speedup is its cost over the contender's, for the same tokens.
        speedup = plain_cost / cost if cost else None
        out[name] = Prediction(speedup, tokens, checks, reproduced, len(encoded), drafted, accepted)
        if reproduced < len(encoded):
            log.warning(
                "%s: the replay reproduced plain output on %d of %d prompts",
                name,
                reproduced,
                len(encoded),
            )
    return out


@torch.inference_mode()
def _final_hidden(target: LoadedTarget, sequence: Sequence[int]) -> torch.Tensor:
    """The target's final hidden states over ``sequence`` in one teacher-forced pass
    (transformers' forward: no cache of the engine's)."""
    ids = torch.tensor([list(sequence)], dtype=torch.int64, device=target.device)
    return target.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
