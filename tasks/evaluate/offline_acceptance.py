"""Greedy acceptance of a draft replayed on recorded target output, without decoding.

Under greedy verification the target's output does not depend on the draft, so a draft's
acceptance on a prompt is fixed by one question per position: would its ``d``-th draft be
the target's token there? ``ok[d - 1][t]`` answers it for the decoding step whose last known
token is ``x_t`` (the draft's ``d``-th guess is for ``x_{t + d}``), given the earlier guesses of
that step were right. :func:`replay` walks the answer the way the engine does (accept the
leading correct drafts, add the target's own token, move on) and counts target steps.

Two sources of ``ok``, both on a teacher cache of the target's own greedy answers
(:mod:`tasks.train.teacher`):

- :func:`head_hits`: a draft head's ``depths`` chained drafts (step 1 on true features, each
  later step on the head's own predicted feature, exactly
  :func:`tasks.train.head_loss.head_predictions`);
- :func:`model_hits`: a model draft's greedy next tokens, teacher-forced (with every earlier
  guess right, its context is the target's own tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tasks.train.teacher import TeacherSequence


@dataclass(frozen=True)
class Replay:
    steps: int  # target verification steps after the prefill
    tokens: int  # answer tokens those steps produced
    drafted_hits: int  # answer positions whose first draft was right (for agreement)
    scored: int  # answer positions scored for agreement

    @property
    def mean_accepted_length(self) -> float | None:
        return self.tokens / self.steps if self.steps else None

    @property
    def agreement(self) -> float | None:
        return self.drafted_hits / self.scored if self.scored else None

    def __add__(self, other: Replay) -> Replay:
        return Replay(
            self.steps + other.steps,
            self.tokens + other.tokens,
            self.drafted_hits + other.drafted_hits,
            self.scored + other.scored,
        )


def replay(ok: Sequence[Sequence[bool]], prompt_len: int, length: int, k: int) -> Replay:
    """Walk one answer (tokens ``prompt_len .. length - 1``) with ``k`` drafts per step.

    ``ok[d][t]`` for ``d < k``: the ``(d + 1)``-th draft of the step whose last known token is
    ``x_t`` is right. As in :mod:`serving.engine.decoder`, the prefill covers the prompt but
    its last token, which the first step feeds with that step's drafts; every step emits its
    accepted drafts plus the target's own next token.
    """
    if k < 1 or k > len(ok):
        raise ValueError(f"k must be in [1, {len(ok)}] for these hits, got {k!r}")
    if prompt_len < 1:
        raise ValueError(f"a prompt needs at least one token, got prompt_len={prompt_len!r}")
    steps = tokens = 0
    t = prompt_len - 1  # the first step's last known token
    while t + 1 < length:
        accepted = 0
        while accepted < k and t + accepted + 1 < length and ok[accepted][t]:
            accepted += 1
        emitted = min(accepted + 1, length - 1 - t)
        steps += 1
        tokens += emitted
        t += emitted
    answer = range(prompt_len - 1, length - 1)  # steps may start at any of these
    hits = sum(bool(ok[0][t]) for t in answer)
    return Replay(steps, tokens, hits, len(answer))


@torch.no_grad()
def head_hits(head, sequence: TeacherSequence, frozen, depths: int = 2) -> list[list[bool]]:
    """``depths`` rows of hits of a draft head's chained drafts on one recorded sequence
    (see module doc)."""
    from tasks.train.head_data import make_batch
    from tasks.train.head_loss import head_predictions

    length = int(sequence.tokens.shape[0])
    device = next(head.parameters()).device
    batch = make_batch([(sequence, 0)], length).to(device)
    hits = [[False] * length for _ in range(depths)]
    tokens = sequence.tokens.tolist()
    for depth, predicted in enumerate(head_predictions(head, batch, frozen, depths=depths)):
        top = (predicted[0] @ frozen.output_rows.T).argmax(dim=-1)  # [len - 1] reduced index
        if frozen.vocab_ids is not None:
            top = frozen.vocab_ids[top]
        guesses = top.tolist()
        # Head position i guesses x_{i+2}. Step 1 at i = t - 1 is the first draft of step t;
        # step d + 1 at i = t + d - 1 (reading its own step-d feature) is its (d + 1)-th.
        for i, guess in enumerate(guesses):
            t = i + 1 - depth
            if t >= 0 and i + 2 < length:
                hits[depth][t] = guess == tokens[i + 2]
    return hits


@torch.no_grad()
def model_hits(model: torch.nn.Module, sequence: TeacherSequence, k: int) -> list[list[bool]]:
    """``k`` rows of hits of a causal-LM draft on one recorded sequence (see module doc)."""
    device = next(model.parameters()).device
    tokens = sequence.tokens.to(device)[None]  # [1, len]
    guesses = model(input_ids=tokens).logits[0].argmax(dim=-1).tolist()  # guess for x_{j+1}
    actual = sequence.tokens.tolist()
    length = len(actual)
    right = [j + 1 < length and guesses[j] == actual[j + 1] for j in range(length)]
    # The d-th draft of step t guesses x_{t+d} from x_0..x_{t+d-1}: position t + d - 1.
    return [[t + d < length and right[t + d] for t in range(length)] for d in range(k)]


def replay_all(hits_of, sequences: Sequence[TeacherSequence], k: int) -> Replay:
    """Sum of :func:`replay` over ``sequences``; ``hits_of(sequence)`` gives its ``ok``."""
    total = Replay(0, 0, 0, 0)
    for sequence in sequences:
        total += replay(hits_of(sequence), sequence.prompt_len, int(sequence.tokens.shape[0]), k)
    return total
