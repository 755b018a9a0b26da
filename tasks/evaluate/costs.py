"""What drafting costs, profiled: one drafted token's time in one-token target passes.

The modelled speed the gates decide on (:mod:`tasks.evaluate.modelled`) prices each
contender's recorded checks with the target's measured verify curve and its drafter's cost
per drafted token. That cost is measured here for any drafter the engine can run — n-gram,
suffix, ``layers:N``, a head, a LoRA or distilled model, a cascade — the same way: a few
generations with ``k`` fixed, and for every step that drafted, the ratio

    (draft seconds / drafted tokens) / (verify seconds / curve(drafted + 1)),

the step's drafting time per token over the one-token pass its own verification implies
(generating from the evaluation's prompts in order until :data:`ENOUGH_STEPS` steps drafted).
Both halves of a ratio are timed back to back on the same core, so a load that slows the
machine slows both; the median over steps drops the steps a burst of load hit in one half
only. ``specops profile`` reports the same figure for the built-in drafter kinds.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from serving.curves import curve_cost
from serving.engine.metrics import StepRecord
from serving.engine.policy import CostAwareK, FixedK

ENOUGH_STEPS = 24  # drafting steps a profile stops at (it goes on while prompts remain)


def step_ratios(steps: Sequence[StepRecord], curve: Sequence[float]) -> list[float]:
    """Each drafting step's cost per drafted token in one-token passes (see the module
    docstring); steps that drafted nothing or were not timed are left out."""
    ratios = []
    for step in steps:
        if step.proposed <= 0 or step.draft_s <= 0 or step.verify_s <= 0:
            continue
        unit = step.verify_s / curve_cost(tuple(curve), step.proposed + 1)
        ratios.append((step.draft_s / step.proposed) / unit)
    return ratios


def profile_draft_cost(
    decoder,
    prompts: Sequence[Sequence[int]],
    *,
    curve: Sequence[float],
    k: int,
    max_new_tokens: int = 48,
    enough: int = ENOUGH_STEPS,
) -> tuple[float | None, int]:
    """The median cost per drafted token of ``decoder``'s drafter (a
    :class:`~serving.engine.decoder.SpeculativeDecoder`), generating from ``prompts`` in order with
    ``k`` drafts a step until ``enough`` steps drafted (or the prompts run out), and how
    many steps it is the median of; ``(None, 0)`` when nothing was drafted (a drafter that
    drafts nothing with ``k`` fixed drafts nothing under its own policy either). The
    decoder's own policy is set aside meanwhile (a cascade's stays: its stages are its
    own), so a cost-aware policy's long-run estimates are not moved by the profile."""
    if decoder.drafter is None:
        return None, 0
    from serving.engine.cascade.drafter import CascadePolicy

    own = decoder.policy
    if not isinstance(own, CascadePolicy):
        decoder.policy = FixedK(k)
    ratios: list[float] = []
    try:
        for ids in prompts:
            result = decoder.generate(list(ids), max_new_tokens=max_new_tokens)
            ratios += step_ratios(result.steps, curve)
            if len(ratios) >= enough:
                break
    finally:
        decoder.policy = own
    if not ratios:
        return None, 0
    return statistics.median(ratios), len(ratios)


def fix_draft_cost(decoder, cost: float) -> bool:
    """Make ``decoder``'s cost-aware policy price drafting at ``cost`` from now on (so its
    choices of k, and a greedy request's steps, no longer depend on the clock); whether it
    had such a policy."""
    policy = decoder.policy
    if isinstance(policy, CostAwareK):
        policy.use_profiled_draft_cost(cost)
        return True
    return False
