"""When ``collect`` starts a retrain: acceptance relative to the champion, and a cool-down.

An absolute threshold misfires both ways: a champion that never accepted more than 40 % on
code would retrain on every collection, and one that accepted 90 % on grounded edits could
fall to 55 % unnoticed. So a (workload, hardware) group wants a retrain when its rolling
acceptance falls below ``relative`` x what the champion accepted when it was evaluated on
that workload (its held-out traffic slice first, then the built-in workload, then its
evaluation overall); the absolute threshold applies only to a champion never evaluated.
A retrain within ``cooldown_s`` of the last one on that hardware target is held back: a
retrain takes minutes to hours and a drifted workload keeps failing while it runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, model_validator

from registry.acceptance import evaluated_acceptance
from serving.hardware import HardwareTarget
from tasks.data.acceptance import PooledAcceptance


class Trigger(BaseModel):
    """Whether ``collect`` retrains, and why (in its flow result as ``trigger``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    wanted: bool  # some group fell below its threshold
    allowed: bool  # and no cool-down holds it back
    reasons: list[str]  # one line per group: acceptance, threshold, where it came from
    held_back: str | None = None  # why a wanted retrain does not start now
    retrain: bool  # wanted and allowed

    @model_validator(mode="after")
    def _retrain_is_wanted_and_allowed(self) -> Trigger:
        if self.retrain != (self.wanted and self.allowed):
            raise ValueError(
                f"retrain is {self.retrain}, but wanted {self.wanted} and allowed {self.allowed}"
            )
        return self


class ChampionTrigger(Trigger):
    """The trigger of the champion whose served traffic it weighed (the flow's result)."""

    champion: str | None  # its label; None without a champion


def decide_retrain(
    groups: Sequence[PooledAcceptance],
    *,
    hardware: HardwareTarget,
    champion_tags: Mapping[str, str] | None,
    relative: float,
    absolute: float,
    last_retrain_at: float | None,
    cooldown_s: float,
    now: float,
) -> Trigger:
    """``groups``: rolling acceptance per (workload, hardware), as
    :func:`tasks.data.acceptance.rolling_acceptance` (and, on a vLLM target,
    :func:`tasks.data.vllm_acceptance.vllm_groups`) give it."""
    if not 0 < relative <= 1:
        raise ValueError(f"relative must be in (0, 1], got {relative!r}")
    name = hardware.name  # what the groups and the champion's tags carry
    reasons, wanted = [], False
    for group in groups:
        acceptance = group.acceptance
        if group.hardware != name or acceptance is None:
            continue
        workload = group.workload
        reference = evaluated_acceptance(champion_tags or {}, name, workload)
        if reference is None:
            threshold, basis = absolute, "the absolute threshold (champion never evaluated)"
        else:
            threshold = relative * reference[0]
            basis = f"{relative:g} x {reference[0]:.3f} accepted on {reference[1]}"
        low = acceptance < threshold
        wanted |= low
        reasons.append(
            f"{workload}@{name}: rolling acceptance {acceptance:.3f} "
            f"{'<' if low else '>='} {threshold:.3f} ({basis})"
        )
    held_back = None
    if wanted and last_retrain_at is not None and now - last_retrain_at < cooldown_s:
        left = cooldown_s - (now - last_retrain_at)
        held_back = (
            f"cool-down: the last retrain on {name} was {(now - last_retrain_at) / 60:.0f} "
            f"min ago; the next may start in {left / 60:.0f} min"
        )
    allowed = held_back is None
    return Trigger(
        wanted=wanted,
        allowed=allowed,
        reasons=reasons,
        held_back=held_back,
        retrain=wanted and allowed,
    )
