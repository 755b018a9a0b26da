"""The prompt type of every workload, train/held-out splitting and seeded selection.

Every prompt of a built-in workload belongs to a split (``train`` or ``heldout``) chosen by a
stable hash of an id (:func:`split_of`), never by sampling order, so evaluation prompts cannot
leak into training. A user's own traffic (:mod:`tasks.data.chat_requests`) is all ``train``:
its held-out part is its newest share, chosen once collected
(:func:`tasks.data.dataset.holdout_by_time`).

Selection is seeded: prompts are ranked by a hash of ``(seed, id)``, so the same seed gives
the same prompts in the same order, a larger ``n`` extends a smaller one, and different
seeds give different picks. The helpers here are shared by the sources
(:mod:`tasks.data.sharegpt`, :mod:`tasks.data.humaneval`, :mod:`tasks.data.grounded`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

from serving.errors import BadInputError
from serving.records.schema import SPLITS, Split, Workload

HELDOUT_FRACTION = 0.2

# "all" selects from both splits; each prompt still records its own split.
SplitSelector = Split | Literal["all"]

# A prompt's workload: a built-in one, or "live" (schema's LIVE_WORKLOAD) for a user's own
# traffic read from a file (tasks.data.chat_requests), recorded like the server's capture.
PromptWorkload = Workload | Literal["live"]


@dataclass(frozen=True)
class Prompt:
    """One request of a workload.

    ``reference`` is the dataset's own answer (ShareGPT reply, HumanEval canonical
    solution); for grounded prompts it is the source text that the answer should copy; a
    user's own traffic has none.
    """

    id: str
    workload: PromptWorkload
    # Chat messages: the user turn only for the built-in workloads; a user's own traffic
    # keeps the whole conversation (system prompt and earlier turns, the user's turn last).
    messages: list[dict[str, str]]
    reference: str | None
    split: Split

    @property
    def user_text(self) -> str:
        return "\n\n".join(m["content"] for m in self.messages if m["role"] == "user")


# ---------------------------------------------------------------------------- splitting


def split_of(prompt_id: str, heldout_fraction: float = HELDOUT_FRACTION) -> Split:
    """``"heldout"`` for about ``heldout_fraction`` of ids, ``"train"`` for the rest.

    Depends only on the id (sha256, not Python's salted ``hash``), so it is the same in
    every process and whatever order prompts are drawn in.
    """
    if not 0.0 <= heldout_fraction <= 1.0:
        raise BadInputError(f"heldout_fraction must be between 0 and 1, got {heldout_fraction!r}")
    return "heldout" if _unit_hash(f"split:{prompt_id}") < heldout_fraction else "train"


def _unit_hash(text: str) -> float:
    """A stable pseudo-random number in [0, 1) derived from ``text``."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def in_split(prompt_id: str, split: SplitSelector) -> bool:
    return split == "all" or split_of(prompt_id) == split


# ---------------------------------------------------------------------------- selection


def seeded_order(ids: Sequence[str], seed: int, salt: str) -> list[int]:
    """Indices of ``ids`` ranked by a hash of ``(seed, salt, id)``: a stable shuffle."""
    keys = [hashlib.sha256(f"{seed}:{salt}:{i}".encode()).digest() for i in ids]
    return sorted(range(len(ids)), key=keys.__getitem__)


def take(
    candidates: Sequence[Prompt], n: int, *, seed: int, workload: str, split: str
) -> list[Prompt]:
    """The first ``n`` of ``candidates`` in the seeded order of ``workload``."""
    if n > len(candidates):
        raise BadInputError(
            f"asked for n={n} {workload} prompts but split {split!r} has only "
            f"{len(candidates)}; ask for fewer or choose another split"
        )
    order = seeded_order([c.id for c in candidates], seed, workload)
    return [candidates[i] for i in order[:n]]


def normalised(text: str) -> str:
    """``text`` with runs of whitespace collapsed and case folded: the key for repeats."""
    return " ".join(text.split()).casefold()


def check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise BadInputError(f"n must be a positive integer, got {n!r}")


def check_split(split: str) -> None:
    if split not in (*SPLITS, "all"):
        raise BadInputError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}, all")


def as_split(split: str) -> SplitSelector:
    """``split`` checked (:class:`BadInputError` naming it otherwise) and typed."""
    check_split(split)
    return cast(SplitSelector, split)
