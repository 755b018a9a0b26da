"""Detailed-mode records: every draft/target disagreement of a request, JSON-ready.

The collection pipeline reads these. Bump ``SCHEMA_VERSION`` on any change of fields.

A rejected draft is declared once, from the step to the store: the step reports a
:class:`Rejection`; the record keeps it as a :class:`Disagreement`, the same fields placed
in the output (``position``) with the tokens before it (``context``); the stored record
(:class:`serving.records.schema.RequestRecord`) holds these very dataclasses and checks their
values. Likewise a drafted token is :class:`serving.engine.features.DraftedToken` throughout.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field

from serving.engine.features import DraftedToken

SCHEMA_VERSION = 2  # 2: per-drafted-token features (`drafted`) and `unverified`


@dataclass(frozen=True)
class Rejection:
    """The first rejected draft of a step (later drafts were conditioned on it: moot)."""

    draft_index: int  # 0-based position in the draft block
    draft_token: int
    target_token: int  # the token the target produced there instead
    target_prob_of_draft: float
    target_prob_of_target: float
    draft_prob_of_draft: float
    draft_prob_of_target: float


@dataclass(frozen=True)
class _InOutput:
    position: int  # index in the generated output where the draft was rejected


@dataclass(frozen=True)
class Disagreement(Rejection, _InOutput):
    """A rejection where the record keeps it. Its fields, in the stored order: ``position``
    (``_InOutput``'s: dataclasses lay out the bases' fields last base first), the
    rejection's, then ``context``."""

    context: list[int]  # the tokens right before `position` (prompt included)

    @classmethod
    def of(cls, rejection: Rejection, *, position: int, context: list[int]) -> Disagreement:
        return cls(position=position, context=context, **vars(rejection))


@dataclass
class DetailedRecord:
    request_id: str
    drafter: dict[str, object]
    policy: dict[str, object]
    sampling: dict[str, object]
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    from_draft: list[bool]
    acceptance_rate: float | None
    mean_accepted_length: float | None
    draft_tokens: int
    accepted_tokens: int
    checks: int
    # [proposed, accepted] per target pass, in order: per-position acceptance pools from these.
    steps: list[list[int]] = field(default_factory=list)
    disagreements: list[Disagreement] = field(default_factory=list)
    # Every drafted token the target ruled on (up to and including a block's first
    # rejection; later drafts were conditioned on it), with its features and verdict.
    drafted: list[DraftedToken] = field(default_factory=list)
    # Output positions kept although the target disagreed (relaxed cascade mode only).
    unverified: list[int] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def new_request_id() -> str:
    return uuid.uuid4().hex
