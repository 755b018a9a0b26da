"""Suffix drafting (SuffixDecoding-style): continue the longest matching suffix the way the
indexed text most often continued it.

Two indexes answer each lookup: the request's own tokens (prompt and output so far,
extended on every commit) and, optionally, a global corpus of earlier outputs of the target
(built from collected traffic by :mod:`tasks.train.suffix_index`). Both are suffix automata over
token ids, so finding the longest suffix of the request that occurs in an index is
amortised O(1) per token with no bound on its length, and every state knows how often its
strings occur: the count of ``matched + [t]`` is the count of the state reached on ``t``.

Drafting is greedy over that frequency tree: at each position take the index whose match is
longer (the request's own on a tie), propose its most frequent continuation (ties go to the
most recent occurrence), and carry on from the extended match. A match that runs into the
end of the indexed text falls back to its longest suffix that has been continued, so a
repeating span keeps being copied, as prompt lookup does. The relative frequency of each
drafted token is its confidence; the product along the path stops the draft when it falls
below ``min_path_confidence`` (SuffixDecoding's path score), and ``max_spec_factor`` caps the
draft at that many tokens per matched token (its adaptive speculation length).

The global corpus is stored as token sequences (a small JSON file with a manifest and a
checksum); the automaton is rebuilt on load (15 ms for a 5k-token corpus; about 0.3 s per
100k tokens).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from serving.engine.drafters.base import Drafter, DraftProposal, DraftRequest, StepFeedback
from serving.errors import BadInputError, IncompatibleDraftError, ModelSourceError

SEPARATOR = -1  # ends a sequence of a multi-sequence index; never matched, never proposed
# An indexed token costs about 450 bytes (one or two states, each with a dict of children):
# the cap keeps a global index under about half a gigabyte.
MAX_INDEX_TOKENS = 1_000_000
CORPUS_FORMAT = "specops-suffix-corpus"
CORPUS_VERSION = 1

Cursor = tuple[int, int]  # (automaton state, length of the matched suffix)
ROOT: Cursor = (0, 0)


class SuffixIndex:
    """A suffix automaton over token ids with occurrence counts, built online.

    ``extend`` appends to the text; ``add_sequence`` appends a whole sequence and a
    separator, so that matches never span two sequences. Every state holds the number of
    end positions of its strings (how often they occur) and the most recent one.
    """

    def __init__(self, *, max_tokens: int | None = MAX_INDEX_TOKENS) -> None:
        if max_tokens is not None and (isinstance(max_tokens, bool) or max_tokens < 1):
            raise BadInputError(
                f"max_tokens must be a positive integer or None, got {max_tokens!r}"
            )
        self.max_tokens = max_tokens
        self._children: list[dict[int, int]] = [{}]
        self._link = [-1]
        self._length = [0]  # length of the longest string of each state
        self._count = [0]  # how many times the state's strings occur
        self._recent = [-1]  # the most recent end position of the state's strings
        self._last = 0
        self._position = 0  # symbols appended, separators included
        self._tokens = 0  # tokens appended, separators excluded
        self._sequences = 0
        self._max_token_id = -1
        # state -> (token, count, total) of its most frequent continuation; cleared on append
        self._best: dict[int, tuple[int, int, int] | None] = {}

    def __len__(self) -> int:
        return self._tokens

    @property
    def states(self) -> int:
        return len(self._length)

    @property
    def sequences(self) -> int:
        return self._sequences

    @property
    def max_token_id(self) -> int:
        return self._max_token_id

    # ------------------------------------------------------------------------ building

    def extend(self, tokens: Iterable[int]) -> None:
        """Append ``tokens`` to the text (the current sequence)."""
        tokens = [int(t) for t in tokens]
        if self.max_tokens is not None and self._tokens + len(tokens) > self.max_tokens:
            raise BadInputError(
                f"the suffix index would hold {self._tokens + len(tokens)} tokens, over its "
                f"cap of max_tokens={self.max_tokens}; index fewer sequences (the newest) or "
                "raise the cap"
            )
        for token in tokens:
            if token < 0:
                raise BadInputError(f"token ids must be >= 0, got {token}")
            self._append(token)
            self._max_token_id = max(self._max_token_id, token)
        self._tokens += len(tokens)
        if tokens:
            self._best.clear()

    def add_sequence(self, tokens: Sequence[int]) -> None:
        """Index one whole sequence; later sequences never match across its end."""
        self.extend(tokens)
        self._append(SEPARATOR)
        self._sequences += 1
        self._best.clear()

    def _new_state(self, length: int, link: int, children: dict[int, int], count: int) -> int:
        self._children.append(children)
        self._link.append(link)
        self._length.append(length)
        self._count.append(count)
        self._recent.append(-1)
        return len(self._length) - 1

    def _append(self, symbol: int) -> None:
        children, link, length = self._children, self._link, self._length
        current = self._new_state(length[self._last] + 1, -1, {}, 0)
        state = self._last
        while state != -1 and symbol not in children[state]:
            children[state][symbol] = current
            state = link[state]
        if state == -1:
            link[current] = 0
        else:
            child = children[state][symbol]
            if length[state] + 1 == length[child]:
                link[current] = child
            else:
                clone = self._new_state(
                    length[state] + 1, link[child], dict(children[child]), self._count[child]
                )
                self._recent[clone] = self._recent[child]
                while state != -1 and children[state].get(symbol) == child:
                    children[state][symbol] = clone
                    state = link[state]
                link[child] = link[current] = clone
        self._last = current
        # The new end position belongs to every suffix of the text: the suffix-link path.
        position = self._position
        count, recent = self._count, self._recent
        state = current
        while state > 0:
            count[state] += 1
            recent[state] = position
            state = link[state]
        self._position += 1

    # ------------------------------------------------------------------------ matching

    def advance(self, cursor: Cursor, token: int) -> Cursor:
        """The longest suffix of ``matched + [token]`` that occurs in the index."""
        state, matched = cursor
        children, link, length = self._children, self._link, self._length
        while state and token not in children[state]:
            state = link[state]
            matched = length[state]
        child = children[state].get(token)
        if child is None:
            return ROOT
        return child, matched + 1

    def match(self, tokens: Iterable[int], cursor: Cursor = ROOT) -> Cursor:
        """Feed ``tokens`` from ``cursor``: the longest suffix of the text read so far."""
        for token in tokens:
            cursor = self.advance(cursor, int(token))
        return cursor

    def tail(self) -> Cursor:
        """The cursor of the whole indexed text (an index of one growing sequence)."""
        return self._last, self._length[self._last]

    def settle(self, cursor: Cursor) -> Cursor:
        """Shorten ``cursor`` to its longest suffix that the index has seen continued."""
        state, matched = cursor
        children, link, length = self._children, self._link, self._length
        while state and not self._continued(children[state]):
            state = link[state]
            matched = length[state]
        return state, matched

    @staticmethod
    def _continued(children: dict[int, int]) -> bool:
        return len(children) > (SEPARATOR in children)

    def continuation(self, state: int) -> tuple[int, int, int] | None:
        """``(token, count, total)``: the most frequent token after ``state``'s strings (ties
        to the most recent), how often it followed them and how often any token did."""
        if state in self._best:
            return self._best[state]
        count, recent = self._count, self._recent
        best: tuple[int, int, int] | None = None
        best_key = (0, -1)
        total = 0
        for token, child in self._children[state].items():
            if token == SEPARATOR:
                continue
            total += count[child]
            key = (count[child], recent[child])
            if key > best_key:
                best_key, best = key, (token, count[child], 0)
        if best is not None:
            best = (best[0], best[1], total)
        self._best[state] = best
        return best

    def occurrences(self, pattern: Sequence[int]) -> int:
        """How many times ``pattern`` (non-empty) occurs in the indexed text."""
        state = 0
        for token in pattern:
            state = self._children[state].get(int(token), -1)
            if state < 0:
                return 0
        return self._count[state] if state else 0


@dataclass(frozen=True)
class SuffixCorpus:
    """Token sequences for a global suffix index, with where they came from."""

    sequences: tuple[tuple[int, ...], ...]
    manifest: dict[str, object] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.sequences)

    def checksum(self) -> str:
        return _checksum(self.sequences)

    def index(self, *, max_tokens: int | None = MAX_INDEX_TOKENS) -> SuffixIndex:
        index = SuffixIndex(max_tokens=max_tokens)
        for sequence in self.sequences:
            index.add_sequence(sequence)
        return index

    def to_payload(self) -> dict[str, object]:
        return {
            "format": CORPUS_FORMAT,
            "version": CORPUS_VERSION,
            "sequences": len(self.sequences),
            "tokens": self.tokens,
            "max_token_id": max((max(s) for s in self.sequences if s), default=-1),
            "sha256": self.checksum(),
            "manifest": self.manifest,
            "token_ids": [list(s) for s in self.sequences],
        }

    @classmethod
    def from_payload(cls, payload: object, *, source: str = "<payload>") -> SuffixCorpus:
        """Check a payload written by :meth:`to_payload`; raise :class:`ModelSourceError`
        naming ``source`` and what is wrong."""

        def bad(reason: str) -> ModelSourceError:
            return ModelSourceError(
                f"suffix corpus {source!r} is not usable: {reason}; rebuild it with "
                "tasks.train.suffix_index.build_suffix_index"
            )

        if not isinstance(payload, dict) or payload.get("format") != CORPUS_FORMAT:
            raise bad(f"not a {CORPUS_FORMAT} file")
        if payload.get("version") != CORPUS_VERSION:
            raise bad(f"version {payload.get('version')!r}, this build reads {CORPUS_VERSION}")
        raw = payload.get("token_ids")
        if not isinstance(raw, list) or not all(isinstance(s, list) for s in raw):
            raise bad("token_ids must be a list of token id lists")
        if not all(type(t) is int and t >= 0 for s in raw for t in s):
            raise bad("token ids must be non-negative integers")
        sequences = tuple(tuple(s) for s in raw)
        corpus = cls(sequences, dict(payload.get("manifest") or {}))
        if payload.get("sequences") != len(sequences) or payload.get("tokens") != corpus.tokens:
            raise bad(
                f"the header says {payload.get('sequences')!r} sequences / "
                f"{payload.get('tokens')!r} tokens, the file holds {len(sequences)} / "
                f"{corpus.tokens}"
            )
        if payload.get("sha256") != corpus.checksum():
            raise bad("its checksum does not match its token ids")
        return corpus


def _checksum(sequences: Sequence[Sequence[int]]) -> str:
    digest = hashlib.sha256()
    for sequence in sequences:
        digest.update(json.dumps(list(sequence), separators=(",", ":")).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def load_suffix_corpus(path: str | Path) -> SuffixCorpus:
    """Read a corpus file; :class:`ModelSourceError` if it is missing or corrupt."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelSourceError(
            f"suffix corpus {str(path)!r} does not exist; build one with "
            "tasks.train.suffix_index.build_suffix_index"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelSourceError(
            f"suffix corpus {str(path)!r} cannot be read ({error}); rebuild it with "
            "tasks.train.suffix_index.build_suffix_index"
        ) from None
    return SuffixCorpus.from_payload(payload, source=str(path))


class SuffixDrafter(Drafter):
    kind = "suffix"
    deterministic = True

    def __init__(
        self,
        global_index: SuffixIndex | None = None,
        *,
        min_match: int = 1,
        max_spec_factor: float | None = None,
        min_path_confidence: float = 0.0,
        source: dict[str, object] | None = None,
    ) -> None:
        if isinstance(min_match, bool) or not isinstance(min_match, int) or min_match < 1:
            raise BadInputError(f"min_match must be an integer >= 1, got {min_match!r}")
        if max_spec_factor is not None and not max_spec_factor > 0:
            raise BadInputError(f"max_spec_factor must be > 0 or None, got {max_spec_factor!r}")
        if not 0.0 <= min_path_confidence <= 1.0:
            raise BadInputError(
                f"min_path_confidence must be in [0, 1], got {min_path_confidence!r}"
            )
        self.global_index = global_index
        self.min_match = min_match
        self.max_spec_factor = max_spec_factor
        self.min_path_confidence = min_path_confidence
        self.source = dict(source or {})
        self.name = "suffix" if global_index is None else f"suffix(global={len(global_index)})"
        self._request = SuffixIndex(max_tokens=None)
        self._global_cursor = ROOT  # the request's longest suffix found in the global index

    def check_compatible(self, target_vocab_size: int) -> None:
        if self.global_index is not None and self.global_index.max_token_id >= target_vocab_size:
            raise IncompatibleDraftError(
                f"the suffix corpus holds token id {self.global_index.max_token_id} but the "
                f"target's vocabulary has {target_vocab_size} tokens; build the corpus from "
                "this target's traffic"
            )

    def begin(self, prompt: list[int]) -> None:
        self._request = SuffixIndex(max_tokens=None)
        self._request.extend(prompt)
        if self.global_index is not None:
            self._global_cursor = self.global_index.match(prompt)

    def commit(self, feedback: StepFeedback) -> None:
        self._request.extend(feedback.new_tokens)
        if self.global_index is not None:
            self._global_cursor = self.global_index.match(feedback.new_tokens, self._global_cursor)

    def end(self) -> None:
        self._request = SuffixIndex(max_tokens=None)
        self._global_cursor = ROOT

    def propose(self, request: DraftRequest) -> DraftProposal:
        # The request's own index first: it wins ties.
        indexes = [self._request]
        cursors = [self._request.tail()]
        if self.global_index is not None:
            indexes.append(self.global_index)
            cursors.append(self._global_cursor)
        draft: list[int] = []
        confidence: list[float] = []
        matched_lengths: list[int] = []
        budget = request.k
        path_confidence = 1.0
        while len(draft) < budget:
            cursors = [index.settle(c) for index, c in zip(indexes, cursors, strict=True)]
            chosen = max(range(len(cursors)), key=lambda i: (cursors[i][1], -i))
            state, matched = cursors[chosen]
            if matched < self.min_match:
                break
            if not draft and self.max_spec_factor is not None:
                budget = min(budget, math.ceil(self.max_spec_factor * matched))
            best = indexes[chosen].continuation(state)
            if best is None:
                break
            token, count, total = best
            path_confidence *= count / total
            if path_confidence < self.min_path_confidence:
                break
            draft.append(token)
            confidence.append(count / total)
            matched_lengths.append(matched)
            cursors = [index.advance(c, token) for index, c in zip(indexes, cursors, strict=True)]
        return DraftProposal(  # on the CPU; the step moves it to the target's device
            torch.tensor(draft, dtype=torch.int64, device="cpu"),
            confidence=torch.tensor(confidence, dtype=torch.float32, device="cpu"),
            match_len=torch.tensor(matched_lengths, dtype=torch.int64, device="cpu"),
        )

    def describe(self) -> dict[str, object]:
        described: dict[str, object] = {
            "name": self.name,
            "kind": "suffix",
            "min_match": self.min_match,
            "max_spec_factor": self.max_spec_factor,
            "min_path_confidence": self.min_path_confidence,
        }
        if self.global_index is not None:
            described["global_tokens"] = len(self.global_index)
            described["global_sequences"] = self.global_index.sequences
            described.update({f"global_{k}": v for k, v in self.source.items()})
        return described


def suffix_drafter(
    path: str | Path | None = None,
    *,
    min_match: int = 1,
    max_spec_factor: float | None = None,
    min_path_confidence: float = 0.0,
) -> SuffixDrafter:
    """The drafter for the spec ``suffix[:PATH]``: the request's own index, plus the global
    index rebuilt from the corpus file at ``path`` when one is given."""
    if path is None:
        return SuffixDrafter(
            min_match=min_match,
            max_spec_factor=max_spec_factor,
            min_path_confidence=min_path_confidence,
        )
    corpus = load_suffix_corpus(path)
    try:
        index = corpus.index()
    except BadInputError as error:
        raise ModelSourceError(f"suffix corpus {str(path)!r}: {error}") from None
    return SuffixDrafter(
        index,
        min_match=min_match,
        max_spec_factor=max_spec_factor,
        min_path_confidence=min_path_confidence,
        source={"path": str(path), "sha256": corpus.checksum()},
    )
