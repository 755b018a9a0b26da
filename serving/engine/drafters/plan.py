"""The draft plan: which drafter, under which draft-length policy, drafting how far.

A :class:`DraftPlan` is what every front asks for — a command's ``--drafter/--policy/-k``,
an HTTP request's ``drafter``, a draft package's ``draft.json`` (``drafter``, ``policy``,
``k``, exactly as stored; :func:`in_package` resolves its paths), a champion, an
evaluation's contender — parsed from its strings
in one place (:meth:`DraftPlan.parse`) and turned into a decoder in one place
(:func:`serving.engine.build.build_decoder`). A :class:`CascadePlan` is the same for a
draft cascade (:mod:`serving.engine.cascade`): its stages in order, its largest block and
its acceptance predictor. Every check runs at parse time, before any weights load: an
unknown kind or policy, a bad k, a spec's bad argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from serving.defaults import DEFAULT_CASCADE_K, DEFAULT_K, DEFAULT_POLICY
from serving.engine.drafters.factory import parse_drafter_spec
from serving.engine.drafters.kinds import (
    KIND_BY_NAME,
    DrafterKind,
    DrafterSpec,
    kind_of,
    split_spec,
)
from serving.engine.policy import PolicyName, check_k, check_policy
from serving.errors import BadInputError, ModelSourceError

__all__ = [
    "DEFAULT_CASCADE_K",
    "DEFAULT_K",
    "DEFAULT_POLICY",
    "PLAIN",
    "CascadePlan",
    "DraftPlan",
    "Plan",
    "in_package",
]

NO_DRAFT = DrafterSpec("none")


@dataclass(frozen=True)
class DraftPlan:
    """One drafter under one policy (see the module docstring). Plain decoding is the plan
    whose drafter is ``none``."""

    drafter: DrafterSpec = NO_DRAFT
    policy: PolicyName = DEFAULT_POLICY
    k: int = DEFAULT_K

    def __post_init__(self) -> None:
        check_policy(self.policy)
        if self.drafts:  # plain decoding drafts nothing: its k is never used
            check_k(self.k)

    @classmethod
    def parse(cls, drafter: str, *, policy: str = DEFAULT_POLICY, k: int = DEFAULT_K) -> DraftPlan:
        """The plan of a drafter spec string and a policy and k, every part checked (k
        only where it drafts)."""
        return cls(parse_drafter_spec(drafter), check_policy(policy), k)

    @property
    def kind(self) -> DrafterKind:
        return KIND_BY_NAME[self.drafter.kind]

    @property
    def drafts(self) -> bool:
        """False for plain decoding."""
        return self.drafter.kind != "none"

    def with_limits(self, *, policy: str | None = None, k: int | None = None) -> DraftPlan:
        """This drafter under another policy or k (a request's override)."""
        return replace(
            self,
            policy=check_policy(policy) if policy is not None else self.policy,
            k=check_k(k) if k is not None else self.k,
        )

    def relocated(self, folder: Path) -> DraftPlan:
        """This plan with its drafter's package-relative paths resolved against the
        package ``folder`` (:func:`in_package`) and checked."""
        spec = str(self.drafter)
        located = in_package(spec, folder)
        if located == spec:
            return self
        return replace(self, drafter=parse_drafter_spec(located))

    def fields(self) -> dict[str, object]:
        """The plan as draft.json stores it: ``drafter``, ``policy``, ``k``."""
        return {"drafter": str(self.drafter), "policy": self.policy, "k": self.k}


@dataclass(frozen=True)
class CascadePlan:
    """A draft cascade: ``stages`` drafted in order, blocks of at most ``k`` tokens, and
    the acceptance predictor folder that drives it (None: its running acceptance)."""

    stages: tuple[DrafterSpec, ...]
    k: int = DEFAULT_CASCADE_K
    predictor: Path | None = None

    def __post_init__(self) -> None:
        check_k(self.k, name="the cascade's k")
        if not self.stages:
            raise BadInputError(
                "the cascade's stage list is empty; give drafters in order, "
                "e.g. suffix,pld:3,head:PATH"
            )
        seen: set[str] = set()
        for spec in self.stages:
            if spec.kind == "none":
                raise BadInputError(
                    "'none' is not a cascade stage: the target is always the last stage"
                )
            if str(spec) in seen:
                raise BadInputError(f"cascade stage {str(spec)!r} appears twice")
            seen.add(str(spec))

    @classmethod
    def parse(
        cls,
        stages: str | Sequence[str],
        *,
        k: int = DEFAULT_CASCADE_K,
        predictor: str | Path | None = None,
    ) -> CascadePlan:
        """``"suffix,pld:3"`` or ``["suffix", "pld:3"]``, checked."""
        items = stages.split(",") if isinstance(stages, str) else list(stages)
        items = [item.strip() for item in items if item and item.strip()]
        if not items:
            raise BadInputError(
                f"the cascade's stage list {stages!r} is empty; give drafters in order, "
                "e.g. suffix,pld:3,head:PATH"
            )
        specs = tuple(parse_drafter_spec(item) for item in items)
        for spec in specs:
            if spec.kind == "none":
                raise BadInputError(
                    "'none' is not a cascade stage: the target is always the last stage"
                )
        for index, spec in enumerate(specs):
            if str(spec) in map(str, specs[:index]):
                raise BadInputError(f"cascade stage {str(spec)!r} appears twice in {stages!r}")
        return cls(specs, k, None if predictor is None else Path(predictor))

    @property
    def name(self) -> str:
        return ",".join(str(spec) for spec in self.stages)


# What a decoder is built from (serving.engine.build.build_decoder).
Plan = DraftPlan | CascadePlan
PLAIN = DraftPlan()


def in_package(drafter: str, folder: Path) -> str:
    """The drafter spec ``drafter`` as a package stores it (its path argument, or an n-gram
    store, relative to the package) with those paths resolved against the package
    ``folder``, unchecked (parse the result); a path leaving the package is refused."""
    kind, (name, arg) = kind_of(drafter), split_spec(drafter)
    if kind is None or kind.relocate is None or not arg:
        return drafter
    return f"{name}:{kind.relocate(arg, lambda path: str(_inside(folder, path)))}"


def _inside(folder: Path, arg: str) -> Path:
    if Path(arg).is_absolute() or ".." in Path(arg).parts:
        raise ModelSourceError(
            f"draft package {str(folder)!r}: drafter path {arg!r} must stay inside the package"
        )
    return folder / arg
