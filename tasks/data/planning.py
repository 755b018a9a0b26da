"""The planning workload: held-out ShareGPT questions whose answer is naturally a list of
points, the traffic skeleton-of-thought decoding is for (docs/skeleton.md).

The rule (:func:`is_planning_request`), applied to the first user turn of each
held-out ShareGPT conversation (:mod:`tasks.data.sharegpt`, repeats dropped):

1. at most :data:`MAX_PLANNING_CHARS` characters (600), so the question fits beside the
   skeleton and branch instructions of a small model, and at least
   :data:`MIN_PLANNING_WORDS` whitespace-separated words (5), which drops follow-ups such
   as "continue to step 2" and bare links;
2. :data:`PLANNING_PATTERN` matches, case-insensitively: it asks for steps (``step``,
   ``steps``, ``step by step``), a plan, a list, tips, ways, an outline, a checklist, a
   guide, strategies, ideas, a roadmap or an itinerary, says ``how to`` or ``how can /
   do / should / would I / we / you``, or asks for a number of reasons, things, points or
   examples (``5 reasons``);
3. :data:`CODE_PATTERN` does not match: no code fence, no ``{`` or ``}``, no line ending
   in ``;`` (pasted code is answered by code, not by a plan).

Only the held-out split is used: these prompts evaluate a decoding method, so none may
have been trained on. Selection is seeded like every workload
(:func:`tasks.data.prompts.take`, salted ``planning``): the same seed gives the same
prompts in the same order, and a larger ``n`` extends a smaller one. The prompts keep
their ShareGPT ids and the ``sharegpt`` workload (they are a subset of it).
"""

from __future__ import annotations

import re

from tasks.data.prompts import Prompt, check_n, split_of, take
from tasks.data.sharegpt import SharegptPair, sharegpt_id, sharegpt_prompt, unique_sharegpt_pairs

MAX_PLANNING_CHARS = 600
MIN_PLANNING_WORDS = 5

PLANNING_PATTERN = re.compile(
    r"\b(?:steps?|step[- ]by[- ]step|plans?|lists?|tips|ways|outline|checklist|guide"
    r"|strategies|ideas|roadmap|itinerary|how to|how (?:can|do|should|would) (?:i|we|you)"
    r"|\d+ (?:reasons|things|points|examples))\b",
    re.IGNORECASE,
)
CODE_PATTERN = re.compile(r"```|[{}]|;[ \t]*$", re.MULTILINE)


def is_planning_request(text: str, max_chars: int = MAX_PLANNING_CHARS) -> bool:
    """Whether a first user turn belongs to the planning workload (the module's rule)."""
    return (
        len(text) <= max_chars
        and len(text.split()) >= MIN_PLANNING_WORDS
        and PLANNING_PATTERN.search(text) is not None
        and CODE_PATTERN.search(text) is None
    )


def _heldout_planning_pairs() -> list[SharegptPair]:
    return [
        pair
        for pair in unique_sharegpt_pairs()
        if is_planning_request(pair.human) and split_of(sharegpt_id(pair)) == "heldout"
    ]


def planning_prompts(n: int, seed: int = 0) -> list[Prompt]:
    """``n`` held-out ShareGPT first turns that ask for a plan, in seeded order."""
    check_n(n)
    candidates = [sharegpt_prompt(pair) for pair in _heldout_planning_pairs()]
    return take(candidates, n, seed=seed, workload="planning", split="heldout")


def planning_available() -> int:
    """How many held-out ShareGPT first turns the rule selects."""
    return len(_heldout_planning_pairs())
