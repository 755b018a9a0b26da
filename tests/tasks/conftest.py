"""Fixtures for the failure-case data tests: a character tokenizer for the tiny target and a
prompt-lookup decoder over it, so that collection runs the real engine in a second."""

from __future__ import annotations

import pytest

from serving.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine import SpeculativeDecoder
from serving.policy import FixedK
from tasks.traffic import Prompt

FIRST_TEXT_ID = 3  # ids 0-2 are pad, BOS and EOS in the tiny target


class CharTokenizer:
    """One token per printable ASCII character, ids 3..95 (the tiny target's vocab is 96).

    What collection calls on a tokenizer without a chat template: ``chat_template``,
    ``tokenizer(text, add_special_tokens=False)["input_ids"]`` and ``decode``.
    """

    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [FIRST_TEXT_ID + (ord(c) - 32) % 93 for c in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(
            chr(32 + token - FIRST_TEXT_ID)
            for token in ids
            if token >= FIRST_TEXT_ID or not skip_special_tokens
        )


# Short texts with repeats, so that prompt lookup finds something to draft.
TEXTS = [
    "abc abc abc abc",
    "the cat sat on the mat; the cat",
    "hello hello hello",
    "1212121212",
    "fix: teh teh teh",
    "aaaa bbbb aaaa bbbb",
]


def _prompts(texts: list[str] = TEXTS, *, workload: str = "grounded") -> list[Prompt]:
    """Prompts ``p0, p1, ...``; every third one is held out."""
    return [
        Prompt(
            id=f"p{i}",
            workload=workload,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": text}],
            reference=None,
            split="heldout" if i % 3 == 2 else "train",
        )
        for i, text in enumerate(texts)
    ]


@pytest.fixture(scope="session")
def char_tokenizer() -> CharTokenizer:
    return CharTokenizer()


@pytest.fixture(scope="session")
def make_prompts():
    """``make_prompts(texts=TEXTS, workload="grounded")``: traffic for the tiny target."""
    return _prompts


@pytest.fixture
def pld_decoder(target) -> SpeculativeDecoder:
    return SpeculativeDecoder(
        target, drafter=PromptLookupDrafter(), policy=FixedK(4), eos_token_ids=[2]
    )
