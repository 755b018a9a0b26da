"""Incremental detokenization with stop sequences.

Text is released only once it is final: a trailing incomplete UTF-8 character (decoded as
U+FFFD) and any tail that could still grow into a stop sequence are held back. When a stop
sequence appears, the text before it is released and nothing after it ever is.
"""

from __future__ import annotations

from collections.abc import Sequence

REPLACEMENT = "\ufffd"


class TextAssembler:
    def __init__(self, tokenizer, stops: Sequence[str] = ()) -> None:
        self._tokenizer = tokenizer
        self._stops = [s for s in stops if s]
        self._ids: list[int] = []
        self._full = ""
        self.text = ""  # released so far
        self.stopped = False

    def _decode(self) -> str:
        return self._tokenizer.decode(self._ids, skip_special_tokens=True)

    def _held_back(self, text: str) -> int:
        """How many trailing characters of ``text`` could begin a stop sequence."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def add(self, token_id: int) -> str:
        """Take one token; return the text that became final (may be empty)."""
        if self.stopped:
            return ""
        self._ids.append(int(token_id))
        self._full = self._decode()
        hits = [
            i
            for i in (self._full.find(s, max(0, len(self.text) - len(s))) for s in self._stops)
            if i >= 0
        ]
        if hits:
            self.stopped = True
            return self._release(self._full[: min(hits)])
        stable = self._full.rstrip(REPLACEMENT)
        return self._release(stable[: len(stable) - self._held_back(stable)])

    def finish(self) -> str:
        """The request ended: release whatever was held back (nothing after a stop)."""
        if self.stopped:
            return ""
        return self._release(self._full)

    def _release(self, upto: str) -> str:
        if len(upto) <= len(self.text):
            return ""
        delta = upto[len(self.text) :]
        self.text = upto
        return delta
