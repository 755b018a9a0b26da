"""The skeleton grammar as a token constraint the engine can step, copy and drop.

:class:`SkeletonConstraint` is built once per tokenizer and model vocabulary size; its
states are values: :meth:`ConstraintState.advance` returns a new state and never changes
the old one, so a speculative step can advance along draft tokens and keep whichever
prefix state was accepted (rolling back is keeping an older state). The engine calls::

    state = constraint.start()
    while not state.is_finished():
        logits[~state.allowed()] = -inf      # allowed: bool [vocab_size]
        token = sample(logits)
        state = state.advance(token)

Behind it is llguidance's ``LLMatcher`` (the choice and its measurements are in
docs/skeleton.md): a matcher per state, copied (about a microsecond) before each
consumed token. Building the library's view of a tokenizer takes about half a second, so
it is cached per tokenizer object; compiling the grammar takes a few milliseconds and
:meth:`SkeletonConstraint.start` copies one ready matcher.

Masks: ids past the tokenizer (a model vocabulary padded beyond it) are never allowed;
EOS is allowed only once the skeleton is complete, where it is the only allowed token.
A state computes its mask once; masks are also shared between states with the same token
history through a small LRU cache (every skeleton starts ``[PLAN]\\n1.`` or ``[DIRECT]``).
Masks are built with numpy, not torch: a torch elementwise op on a small tensor can wait
milliseconds for its thread pool on a busy CPU.
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import llguidance
import llguidance.hf
import numpy as np
import torch

from serving.errors import BadInputError
from serving.skeleton.grammar import DEFAULT_FORMAT, SkeletonFormat

MASK_CACHE_SIZE = 1024  # packed masks of vocab / 8 bytes each: about 6 MB for SmolLM2

# The library's view of each tokenizer, by (vocab_size, eos ids); it dies with the tokenizer.
_LL_TOKENIZERS: weakref.WeakKeyDictionary[Any, dict[tuple[int, tuple[int, ...]], Any]] = (
    weakref.WeakKeyDictionary()
)
_LL_TOKENIZERS_LOCK = threading.Lock()


def _ll_tokenizer(tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...]) -> Any:
    with _LL_TOKENIZERS_LOCK:
        per_tokenizer = _LL_TOKENIZERS.setdefault(tokenizer, {})
        key = (vocab_size, eos_token_ids)
        if key not in per_tokenizer:
            try:
                per_tokenizer[key] = llguidance.hf.from_tokenizer(
                    tokenizer, n_vocab=vocab_size, eos_token=list(eos_token_ids)
                )
            except ValueError as exc:
                raise BadInputError(
                    f"cannot constrain {type(tokenizer).__name__}: {exc}; pass a fast "
                    "(Rust-backed) Hugging Face tokenizer"
                ) from exc
        return per_tokenizer[key]


class SkeletonConstraint:
    """The skeleton grammar (``fmt``) compiled for ``tokenizer``, masks of ``vocab_size``.

    ``vocab_size`` is the model's (its output rows), at least ``len(tokenizer)``; it
    defaults to ``len(tokenizer)``. ``eos_token_ids`` default to the tokenizer's EOS.
    """

    vocab_size: int

    def __init__(
        self,
        tokenizer: Any,
        *,
        vocab_size: int | None = None,
        fmt: SkeletonFormat = DEFAULT_FORMAT,
        eos_token_ids: Sequence[int] | None = None,
        mask_cache_size: int = MASK_CACHE_SIZE,
    ) -> None:
        tokenizer_size = len(tokenizer)
        vocab_size = tokenizer_size if vocab_size is None else vocab_size
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
            raise BadInputError(f"vocab_size must be an integer, got {vocab_size!r}")
        if vocab_size < tokenizer_size:
            raise BadInputError(
                f"vocab_size {vocab_size} is smaller than the tokenizer ({tokenizer_size} "
                "tokens); pass the model's vocabulary size (config.vocab_size)"
            )
        if eos_token_ids is None:
            if tokenizer.eos_token_id is None:
                raise BadInputError("the tokenizer has no EOS token; pass eos_token_ids")
            eos_token_ids = [tokenizer.eos_token_id]
        eos = tuple(sorted({int(t) for t in eos_token_ids}))
        if not eos or not all(0 <= t < tokenizer_size for t in eos):
            raise BadInputError(
                f"eos_token_ids must be non-empty ids below {tokenizer_size}, got {eos}"
            )
        self.vocab_size = vocab_size
        self.fmt = fmt
        self.eos_token_ids = eos
        self.tokenizer = tokenizer
        ll_tokenizer = _ll_tokenizer(tokenizer, vocab_size, eos)
        grammar = llguidance.LLMatcher.grammar_from_regex(fmt.regex())
        self._initial = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)
        if self._initial.is_error():
            error = _first_line(self._initial)
            raise BadInputError(f"the skeleton grammar {fmt} does not compile: {error}")
        self._mask_cache: OrderedDict[tuple[int, ...], bytes] = OrderedDict()
        self._mask_cache_size = mask_cache_size
        self._lock = threading.Lock()

    def start(self) -> ConstraintState:
        """The state before the first token of the skeleton."""
        return ConstraintState(self, self._initial.deep_copy(), ())

    def _packed_mask(self, tokens: tuple[int, ...], matcher: Any) -> bytes:
        """The bitmask after ``tokens`` (bit ``i % 8`` of byte ``i // 8``), cached by history."""
        with self._lock:
            packed = self._mask_cache.get(tokens)
            if packed is not None:
                self._mask_cache.move_to_end(tokens)
                return packed
        packed = matcher.compute_bitmask()
        with self._lock:
            self._mask_cache[tokens] = packed
            if len(self._mask_cache) > self._mask_cache_size:
                self._mask_cache.popitem(last=False)
        return packed


class ConstraintState:
    """Where the skeleton stands after ``tokens``. Treat it as a value: :meth:`advance`
    returns a new state, and :meth:`copy` shares no mutable state with this one."""

    __slots__ = ("_constraint", "_mask", "_matcher", "tokens")

    def __init__(
        self, constraint: SkeletonConstraint, matcher: Any, tokens: tuple[int, ...]
    ) -> None:
        self._constraint = constraint
        self._matcher = matcher  # owned by this state alone; only read after construction
        self.tokens = tokens
        self._mask: np.ndarray | None = None  # bool [vocab_size], computed once, never mutated

    def allowed(self) -> torch.Tensor:
        """bool [vocab_size], True where the token may come next (a fresh tensor)."""
        if self._mask is None:
            packed = self._constraint._packed_mask(self.tokens, self._matcher)
            bits = np.unpackbits(np.frombuffer(packed, dtype=np.uint8), bitorder="little")
            self._mask = bits[: self._constraint.vocab_size].astype(bool)
        return torch.from_numpy(self._mask.copy())

    def advance(self, token: int) -> ConstraintState:
        """The state after ``token``; :class:`BadInputError` naming it if the grammar does
        not allow it here. This state is unchanged either way."""
        vocab_size = self._constraint.vocab_size
        try:
            if isinstance(token, bool):
                raise TypeError
            token = operator.index(token)  # an int, numpy integer or integer 0-d tensor
        except TypeError:
            raise BadInputError(f"token must be an integer id, got {token!r}") from None
        if not 0 <= token < vocab_size:
            raise BadInputError(f"token {token!r} is outside the vocabulary [0, {vocab_size})")
        matcher = self._matcher.deep_copy()
        if not matcher.consume_token(token):
            raise BadInputError(
                f"token {token} ({self._describe(token)}) is not allowed by the skeleton "
                f"grammar after {self._text()!r}; sample from allowed() only"
            )
        return ConstraintState(self._constraint, matcher, (*self.tokens, token))

    def is_finished(self) -> bool:
        """The skeleton is complete and no token but EOS may follow: stop decoding here."""
        return bool(self._matcher.is_stopped()) and not self._matcher.is_error()

    def copy(self) -> ConstraintState:
        duplicate = ConstraintState(self._constraint, self._matcher.deep_copy(), self.tokens)
        duplicate._mask = self._mask  # immutable once computed
        return duplicate

    def _text(self) -> str:
        return str(self._constraint.tokenizer.decode(list(self.tokens), skip_special_tokens=False))

    def _describe(self, token: int) -> str:
        if token in self._constraint.eos_token_ids:
            return "EOS, before the skeleton is complete"
        if token >= len(self._constraint.tokenizer):
            return "an id past the tokenizer's vocabulary"
        return repr(self._constraint.tokenizer.decode([token], skip_special_tokens=False))


def _first_line(matcher: Any) -> str:
    return str(matcher.get_error()).splitlines()[0] if matcher.get_error() else "unknown error"
