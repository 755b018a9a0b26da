"""A draft plan turned into a decoder: the one place a :class:`SpeculativeDecoder` is made.

Every front builds its decoders here — the server per request, ``generate``, chat, the
benchmark, the profiler, evaluation contenders, collection — from a loaded target and a
plan (:mod:`serving.engine.drafters.plan`): a drafter under a policy, or a cascade under
its own policy. A drafter already built for the plan (a fork of a loaded champion's, a
cascade with its current predictor) is passed in instead of being built again.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from serving.engine.cascade.build import build_cascade
from serving.engine.cascade.drafter import CascadeDrafter, CascadePolicy
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.base import Drafter
from serving.engine.drafters.factory import build_drafter
from serving.engine.drafters.plan import PLAIN, CascadePlan, DraftPlan, Plan
from serving.engine.policy import DraftLengthPolicy, make_policy
from serving.errors import BadInputError
from serving.target import LoadedTarget, check_placed


class _Default(enum.Enum):
    BUILD = "build the drafter from the plan"


_BUILD = _Default.BUILD


def policy_for(plan: DraftPlan, target: LoadedTarget) -> DraftLengthPolicy:
    """The plan's draft-length policy, priced with the target's verify curve."""
    return make_policy(plan.policy, plan.k, verify_curve=target.hardware.curve)


def build_decoder(
    target: LoadedTarget,
    plan: Plan = PLAIN,
    *,
    drafter: Drafter | _Default | None = _BUILD,
    eos_token_ids: Sequence[int] | None = None,
    max_context: int | None = None,
    relax_lambda: float | None = None,
) -> SpeculativeDecoder:
    """A decoder of ``target`` drafting as ``plan`` says. ``drafter``: one already built
    for ``plan`` (default: built here). ``eos_token_ids``, ``max_context`` and
    ``relax_lambda``: as :class:`SpeculativeDecoder` takes them."""
    check_placed(target)
    policy: DraftLengthPolicy | None = None
    if isinstance(plan, CascadePlan):
        cascade = build_cascade(plan, target) if isinstance(drafter, _Default) else drafter
        if not isinstance(cascade, CascadeDrafter):
            raise BadInputError(f"a cascade plan needs a cascade drafter, got {cascade!r}")
        built: Drafter | None = cascade
        policy = CascadePolicy(cascade)
    else:
        built = build_drafter(plan.drafter, target) if isinstance(drafter, _Default) else drafter
        if built is not None:
            policy = policy_for(plan, target)
    return SpeculativeDecoder(
        target,
        drafter=built,
        policy=policy,
        eos_token_ids=eos_token_ids,
        max_context=max_context,
        relax_lambda=relax_lambda,
    )
