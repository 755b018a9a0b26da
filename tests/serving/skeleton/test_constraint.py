"""The skeleton constraint accepts exactly the grammar, token by token.

On a tiny byte-level BPE tokenizer built here (a few merges that cross the grammar's
boundaries: "[PLAN]", "\\n1", ". ") and, marked ``real_model``, on the shipped
SmolLM2 tokenizer (only the tokenizer is loaded: seconds).
"""

from __future__ import annotations

import random
import re

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from serving.errors import BadInputError
from serving.skeleton.constraint import ConstraintState, SkeletonConstraint
from serving.skeleton.grammar import DEFAULT_FORMAT, SkeletonFormat
from serving.skeleton.parse import parse_skeleton
from tests.serving.skeleton.skeletons import INVALID_SKELETONS, VALID_SKELETONS

VALID = VALID_SKELETONS
INVALID = INVALID_SKELETONS

# The longest skeleton in bytes (4-byte characters everywhere), so the most tokens a walk
# can take: every token holds at least one byte.
MAX_SKELETON_BYTES = len("[PLAN]\n[END]") + DEFAULT_FORMAT.max_points * (
    len("6. \n") + 4 * DEFAULT_FORMAT.max_title_chars
)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE: the 256 byte symbols, a few merges, and EOS (id 0)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<eos>": 0, **{symbol: i + 1 for i, symbol in enumerate(alphabet)}}
    # "Ċ" is the byte-level symbol of "\n", "Ġ" of " ".
    pairs = [("[", "P"), ("[P", "L"), ("[PL", "A"), ("[PLA", "N"), ("[PLAN", "]")]
    pairs += [("Ċ", "1"), (".", "Ġ"), ("]", "Ċ"), ("e", "Ġ"), ("t", "h"), ("th", "e")]
    for left, right in pairs:
        vocab[left + right] = len(vocab)
    model = models.BPE(vocab=vocab, merges=pairs)
    backend = Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<eos>"])
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")


@pytest.fixture(scope="module")
def tiny() -> PreTrainedTokenizerFast:
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def real():
    from transformers import AutoTokenizer

    from serving.models.real import real_model_dir

    return AutoTokenizer.from_pretrained(real_model_dir())


def encode(tokenizer, text: str) -> list[int]:
    tokens = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(tokens) == text
    return tokens


def walk(constraint: SkeletonConstraint, tokens: list[int]) -> ConstraintState | None:
    """The state after ``tokens``, or None at the first token the mask refuses (checking
    that advance refuses it too). EOS must be allowed exactly where the skeleton is
    finished (so never inside a valid skeleton, which no other one extends)."""
    state = constraint.start()
    for token in tokens:
        allowed = state.allowed()
        assert allowed.shape == (constraint.vocab_size,) and allowed.dtype == torch.bool
        for eos in constraint.eos_token_ids:
            assert bool(allowed[eos]) == state.is_finished()
        if not allowed[token]:
            with pytest.raises(BadInputError, match=f"token {token} "):
                state.advance(token)
            return None
        state = state.advance(token)
    return state


def only_eos(constraint: SkeletonConstraint, state: ConstraintState) -> bool:
    return state.allowed().nonzero().flatten().tolist() == list(constraint.eos_token_ids)


def random_walk(constraint: SkeletonConstraint, tokenizer, rng: random.Random) -> str:
    """Pick uniformly among the allowed non-EOS tokens until the skeleton is finished."""
    state = constraint.start()
    tokens: list[int] = []
    for _ in range(MAX_SKELETON_BYTES):
        if state.is_finished():
            break
        allowed = state.allowed()
        allowed[list(constraint.eos_token_ids)] = False
        token = rng.choice(allowed.nonzero().flatten().tolist())
        state = state.advance(token)
        tokens.append(token)
    assert state.is_finished(), f"not finished after {len(tokens)} tokens"
    assert only_eos(constraint, state)
    return tokenizer.decode(tokens)


# ----------------------------------------------------------------- tiny tokenizer


def test_tiny_tokenizer_merges_across_the_grammar_boundaries(tiny):
    pieces = [tiny.decode([t]) for t in encode(tiny, "[PLAN]\n1. Take the bus\n2. Go\n[END]")]
    assert "[PLAN]" in pieces and "\n1" in pieces and ". " in pieces and "e " in pieces


@pytest.mark.parametrize("text", VALID)
def test_valid_skeletons_walk_to_a_finished_state(tiny, text):
    constraint = SkeletonConstraint(tiny)
    state = walk(constraint, encode(tiny, text))
    assert state is not None, f"refused a valid skeleton: {text!r}"
    assert state.is_finished() and only_eos(constraint, state)


@pytest.mark.parametrize("text", INVALID)
def test_invalid_skeletons_are_refused(tiny, text):
    constraint = SkeletonConstraint(tiny)
    state = walk(constraint, encode(tiny, text))
    assert state is None or not state.is_finished(), f"accepted {text!r}"
    assert state is None or not state.allowed()[tiny.eos_token_id]


def test_random_walks_end_in_skeletons_that_parse(tiny):
    constraint = SkeletonConstraint(tiny)
    rng = random.Random(0)
    texts = [random_walk(constraint, tiny, rng) for _ in range(40)]
    skeletons = [parse_skeleton(text) for text in texts]
    assert any(s.direct for s in skeletons) and any(len(s.points) > 2 for s in skeletons)


def test_a_smaller_format_is_enforced(tiny):
    fmt = SkeletonFormat(min_points=1, max_points=2, max_title_chars=5)
    constraint = SkeletonConstraint(tiny, fmt=fmt)
    assert walk(constraint, encode(tiny, "[PLAN]\n1. Go\n[END]")) is not None
    assert walk(constraint, encode(tiny, "[PLAN]\n1. abcdef\n[END]")) is None
    assert walk(constraint, encode(tiny, "[PLAN]\n1. a\n2. b\n3. c\n[END]")) is None
    for _ in range(10):
        parse_skeleton(random_walk(constraint, tiny, random.Random(1)), fmt)


def test_ids_past_the_tokenizer_are_never_allowed(tiny):
    constraint = SkeletonConstraint(tiny, vocab_size=len(tiny) + 7)
    state = constraint.start()
    for token in encode(tiny, "[PLAN]\n1. Go"):
        assert state.allowed().shape == (len(tiny) + 7,)
        assert not state.allowed()[len(tiny) :].any()
        state = state.advance(token)
    with pytest.raises(BadInputError, match="past the tokenizer"):
        state.advance(len(tiny) + 3)
    with pytest.raises(BadInputError, match="outside the vocabulary"):
        state.advance(len(tiny) + 7)


def test_eos_is_refused_until_the_skeleton_is_complete(tiny):
    constraint = SkeletonConstraint(tiny)
    state = constraint.start()
    for token in encode(tiny, "[PLAN]\n1. a\n2. b\n"):
        with pytest.raises(BadInputError, match="EOS, before the skeleton is complete"):
            state.advance(tiny.eos_token_id)
        state = state.advance(token)
    for token in encode(tiny, "[END]"):
        state = state.advance(token)
    assert state.is_finished()
    state.advance(tiny.eos_token_id)  # allowed once complete


def test_states_are_values(tiny):
    constraint = SkeletonConstraint(tiny)
    tokens = encode(tiny, "[PLAN]\n1. ab")
    state = constraint.start()
    for token in tokens[:-1]:
        state = state.advance(token)
    before = state.allowed()
    before[:] = False  # the caller owns the tensor it was given
    mask = state.allowed()
    assert mask[tokens[-1]]
    child = state.advance(tokens[-1])
    copied = state.copy()
    assert state.tokens == tuple(tokens[:-1]) and child.tokens == tuple(tokens)
    assert torch.equal(state.allowed(), mask) and torch.equal(copied.allowed(), mask)
    with pytest.raises(BadInputError):
        state.advance(tiny.eos_token_id)
    # A refused token leaves the state usable; a copy advances on its own.
    assert torch.equal(state.advance(tokens[-1]).allowed(), child.allowed())
    assert torch.equal(copied.advance(tokens[-1]).allowed(), child.allowed())
    assert torch.equal(state.allowed(), mask)


def test_bad_arguments_are_named(tiny):
    with pytest.raises(BadInputError, match="vocab_size 10 is smaller"):
        SkeletonConstraint(tiny, vocab_size=10)
    with pytest.raises(BadInputError, match="eos_token_ids"):
        SkeletonConstraint(tiny, eos_token_ids=[len(tiny) + 1])
    with pytest.raises(BadInputError, match="integer id"):
        SkeletonConstraint(tiny).start().advance(1.5)  # type: ignore[arg-type]


# ----------------------------------------------------------------- real tokenizer


@pytest.mark.real_model
@pytest.mark.parametrize("text", VALID)
def test_real_tokenizer_valid_skeletons(real, text):
    constraint = SkeletonConstraint(real, vocab_size=len(real) + 64)
    state = walk(constraint, encode(real, text))
    assert state is not None and state.is_finished() and only_eos(constraint, state)
    assert not constraint.start().allowed()[len(real) :].any()


@pytest.mark.real_model
def test_real_tokenizer_invalid_skeletons(real):
    constraint = SkeletonConstraint(real)
    for text in INVALID:
        state = walk(constraint, encode(real, text))
        assert state is None or not state.is_finished(), f"accepted {text!r}"


@pytest.mark.real_model
def test_real_tokenizer_random_walks_parse(real):
    constraint = SkeletonConstraint(real)
    rng = random.Random(0)
    for _ in range(5):
        text = random_walk(constraint, real, rng)
        assert re.fullmatch(DEFAULT_FORMAT.regex(), text)
        parse_skeleton(text)
