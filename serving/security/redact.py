"""Redaction of captured traffic before it is written.

:class:`Redactor` finds secrets in text: e-mail addresses, API-key-like tokens (OpenAI,
Anthropic, GitHub, Slack, AWS, Google, Hugging Face and bearer tokens, ``key=value``
assignments of a secret-looking name), JSON Web Tokens, payment card numbers (Luhn-checked,
with a card network's first digit), PEM private-key blocks, the password of a URL
(``scheme://user:password@``) and a configured list of extra patterns. A pattern that fails
to compile is an error naming it, at start-up. The patterns follow detect-secrets' plugins
(``JwtTokenDetector``, ``PrivateKeyDetector``, ``BasicAuthDetector``) and presidio's card
recogniser (a regular expression, then the Luhn checksum); neither library is a dependency
(docs/security.md says why).

:func:`redact_record` applies it to one captured record (a schema dict, see
:mod:`serving.records.schema`) *keeping token positions*: the text fields get
``[REDACTED:<kind>]`` in place of each secret; in the token ids, every token that carries
a character of a secret becomes ``mask_id`` (one token for one token), so lengths, output
positions, ``from_draft``, the disagreements' contexts and the drafted tokens' steps all
still line up. Which tokens carry which characters comes from the tokenizer
(:func:`token_ends`); the redacted ids are decoded and scanned again, and a record whose
secret could not be confined to tokens is dropped with the reason, never written
half-redacted.

A rejected draft is not in the output, so it is checked on its own (:func:`_draft_carries`):
it carries a secret when it completes one with the tokens before it, or when it is one of
the record's own masked secret tokens (a lookup drafter copying a pasted key). A
disagreement whose draft or target token carries a secret is *removed* from the record and
counted in ``masked_disagreements`` (a disagreement of two mask tokens is no disagreement,
and validation refuses it); a drafted-token row keeps its place with ``mask_id`` as token.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from serving.errors import BadInputError

# name -> pattern. Conservative on purpose: a false positive costs a few masked tokens of
# training data; a false negative keeps a secret.
BUILTIN_PATTERNS: dict[str, str] = {
    "email": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    "api_key": (
        r"(?:sk|pk|rk)-(?:[A-Za-z0-9]+-)*[A-Za-z0-9_-]{16,}"  # OpenAI/Anthropic/Stripe
        r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub
        r"|xox[abposr]-[A-Za-z0-9-]{10,}"  # Slack
        r"|(?:AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key ids
        r"|AIza[0-9A-Za-z_-]{35}"  # Google
        r"|hf_[A-Za-z0-9]{30,}"  # Hugging Face
        r"|(?i:bearer)\s+[A-Za-z0-9._~+/=-]{16,}"
    ),
    "secret_assignment": (
        r"(?i:api[_-]?key|secret|token|passw(?:or)?d|pwd)[\"']?\s*[:=]\s*[\"']?[^\s\"',;]{6,}"
    ),
    # A JSON Web Token: base64url header and payload (both JSON objects, so ``eyJ``), then the
    # signature (detect-secrets' JwtTokenDetector, without its JSON decoding of the parts).
    "jwt": r"\beyJ[A-Za-z0-9_-]{2,}={0,2}\.[A-Za-z0-9_-]{2,}={0,2}(?:\.[A-Za-z0-9_-]+={0,2})?",
    # 13-19 digits, single spaces or dashes between them; kept only when the Luhn checksum
    # holds and the first digit is a card network's (2-6), see _is_card_number.
    "card_number": r"(?<![\d.,-])\d(?:[ -]?\d){12,18}(?![\d]|[.,-]\d)",
    # A PEM private key, to its END line (or to the end of the text when it was cut off).
    "private_key": (
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
        r"[\s\S]*?(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z)"
    ),
    # The user:password of a URL (detect-secrets' BasicAuthDetector); the host stays.
    "url_password": r"(?<=://)[^\s:/?#@\[\]]+:[^\s/?#@\[\]]+(?=@)",
}


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum of a string of digits (every card number passes it)."""
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char) * (2 if index % 2 else 1)
        total += value - 9 if value > 9 else value
    return total % 10 == 0


def _is_card_number(text: str) -> bool:
    """13-19 digits that pass Luhn and start as a card network's do (2: Mastercard's newer
    range, 3: Amex/Diners/JCB, 4: Visa, 5: Mastercard, 6: Discover/UnionPay): an ordinary
    run of digits passes both one time in fifty, not one time in ten."""
    digits = re.sub(r"[ -]", "", text)
    return 13 <= len(digits) <= 19 and digits[0] in "23456" and luhn_valid(digits)


# Kinds whose pattern finds candidates that a check must confirm.
CHECKS: dict[str, Callable[[str], bool]] = {"card_number": _is_card_number}
PLACEHOLDER = "[REDACTED:{}]"


class RedactionPatternError(BadInputError):
    """A configured redaction pattern that does not compile (named)."""


class RecordDropped(Exception):
    """A captured record that cannot be redacted safely: ``reason`` says why, ``kind``
    is its short name (a metrics label)."""

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.reason, self.kind = reason, kind


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    kind: str


class Redactor:
    def __init__(self, extra: Sequence[str] = (), *, builtins: bool = True) -> None:
        patterns = dict(BUILTIN_PATTERNS) if builtins else {}
        for index, pattern in enumerate(extra):
            patterns[f"pattern_{index + 1}"] = pattern
        self._compiled: list[tuple[str, re.Pattern[str]]] = []
        self._checks = CHECKS if builtins else {}
        for kind, pattern in patterns.items():
            try:
                self._compiled.append((kind, re.compile(pattern)))
            except (re.error, TypeError) as error:
                raise RedactionPatternError(
                    f"redaction pattern {pattern!r} ({kind}) does not compile: {error}"
                ) from None
            if self._compiled[-1][1].search("") is not None:
                raise RedactionPatternError(
                    f"redaction pattern {pattern!r} ({kind}) matches the empty string, so it "
                    "would redact nothing and everything"
                )

    @property
    def kinds(self) -> list[str]:
        return [kind for kind, _ in self._compiled]

    def spans(self, text: str) -> list[Span]:
        """Every secret in ``text``, overlapping ones merged (the first's kind kept)."""
        found = sorted(
            (m.start(), m.end(), kind)
            for kind, pattern in self._compiled
            for m in pattern.finditer(text)
            if m.end() > m.start() and self._checks.get(kind, bool)(m.group())
        )
        merged: list[Span] = []
        for start, end, kind in found:
            if merged and start < merged[-1].end:
                last = merged[-1]
                merged[-1] = Span(last.start, max(last.end, end), last.kind)
            else:
                merged.append(Span(start, end, kind))
        return merged

    def redact_text(self, text: str) -> tuple[str, Counter[str]]:
        counts: Counter[str] = Counter()
        pieces: list[str] = []
        at = 0
        for span in self.spans(text):
            pieces += [text[at : span.start], PLACEHOLDER.format(span.kind)]
            counts[span.kind] += 1
            at = span.end
        pieces.append(text[at:])
        return "".join(pieces), counts


def mask_token(tokenizer) -> int | None:
    """The token that replaces a secret's tokens: the tokenizer's unknown token, else its
    padding token (None: records with secrets are dropped)."""
    for name in ("unk_token_id", "pad_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return None


def _decode(tokenizer, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False)


def _stable_length(text: str) -> int:
    return len(text.rstrip("\ufffd"))  # an incomplete UTF-8 character is not there yet


def token_ends(tokenizer, ids: Sequence[int], *, window: int = 8) -> list[int]:
    """Per token, where its text ends in ``decode(ids)``: token ``i`` carries the
    characters ``[ends[i-1], ends[i])`` (a token that only begins a multi-byte character
    carries none; the one that completes it carries it). Computed over a sliding window
    (linear time) and checked against the full decoding; when a tokenizer's decoding is
    not local enough for that, every prefix is decoded instead (exact, quadratic)."""
    ids = list(ids)
    ends: list[int] = []
    total = 0
    for i in range(len(ids)):
        start = max(0, i - window)
        before = _stable_length(_decode(tokenizer, ids[start:i])) if i > start else 0
        after = _stable_length(_decode(tokenizer, ids[start : i + 1]))
        total += max(after - before, 0)
        ends.append(total)
    full = _decode(tokenizer, ids)
    if not ids or ends[-1] == len(full):
        return ends
    ends, last = [], 0
    for i in range(len(ids)):
        last = max(last, _stable_length(_decode(tokenizer, ids[: i + 1])))
        ends.append(last)
    ends[-1] = len(full)
    return ends


def masked_tokens(ends: Sequence[int], spans: Iterable[Span]) -> set[int]:
    """Indices of the tokens that carry any character of ``spans``."""
    masked: set[int] = set()
    for span in spans:
        begin = 0
        for index, end in enumerate(ends):
            if begin < span.end and end > span.start:
                masked.add(index)
            begin = end
    return masked


def _step_starts(from_draft: Sequence[bool]) -> list[int]:
    """Output position where each verification step's draft block begins: the first at 0,
    each later one after the target's own token that closed the step before (a step emits
    its accepted drafts, then one token of the target's: a disagreement's ``position``)."""
    return [0] + [i + 1 for i, drafted in enumerate(from_draft) if not drafted]


def redact_ids(
    ids: Sequence[int], redactor: Redactor, tokenizer, mask_id: int | None
) -> tuple[list[int], set[int], Counter[str]]:
    """``ids`` with every token that carries a secret replaced by ``mask_id`` (one for one),
    the masked indices and the secrets found by kind. Raises :class:`RecordDropped` when
    there is a secret and no mask token, or when it cannot be confined to whole tokens."""
    ids = list(ids)
    spans = redactor.spans(_decode(tokenizer, ids))
    counts = Counter(span.kind for span in spans)
    if not spans:
        return ids, set(), counts
    if mask_id is None:
        raise RecordDropped(
            "the tokenizer has no unknown or padding token to mask secrets with", "no_mask_token"
        )
    masked = masked_tokens(token_ends(tokenizer, ids), spans)
    redacted = [mask_id if i in masked else t for i, t in enumerate(ids)]
    for attempt in range(4):  # a secret split oddly by the tokenizer: widen a token a side
        left = redactor.spans(_decode(tokenizer, redacted))
        if not left:
            break
        if attempt == 3:
            raise RecordDropped("a secret could not be confined to whole tokens", "unconfined")
        grow = masked_tokens(token_ends(tokenizer, redacted), left)
        masked |= {j for i in grow for j in (i - 1, i, i + 1) if 0 <= j < len(ids)}
        redacted = [mask_id if i in masked else t for i, t in enumerate(ids)]
    return redacted, masked, counts


# Tokens before a rejected draft that are decoded with it, to find a secret it completes.
DRAFT_WINDOW = 24
# A masked token this long (letters and digits) is a secret's own: a draft proposing it
# elsewhere in the record copies the secret. Shorter ones (".", "@", "sk") are everywhere.
_COPY_MIN_CHARS = 3


def _copied_secret_ids(tokenizer, ids: Sequence[int], masked: set[int]) -> set[int]:
    """The ids at ``masked`` positions that carry at least three letters or digits."""
    candidates = sorted({ids[i] for i in masked})
    texts = tokenizer.batch_decode([[t] for t in candidates], skip_special_tokens=False)
    return {
        token
        for token, text in zip(candidates, texts, strict=True)
        if sum(c.isalnum() for c in text) >= _COPY_MIN_CHARS
    }


def _draft_carries(
    redactor: Redactor, tokenizer, redacted: Sequence[int], drafts: Iterable[tuple[int, int]]
) -> dict[tuple[int, int], str]:
    """Of ``drafts`` (``(where, token)``: ``token`` proposed at index ``where`` of the
    redacted sequence), those whose token carries a character of a secret found in the
    window of tokens before it and the token (kind by draft). One batched decode; a second
    only for the windows where something was found."""
    drafts = sorted(set(drafts))
    if not drafts:
        return {}
    windows = [list(redacted[max(0, where - DRAFT_WINDOW) : where]) for where, _ in drafts]
    texts = tokenizer.batch_decode(
        [[*w, token] for w, (_, token) in zip(windows, drafts, strict=True)],
        skip_special_tokens=False,
    )
    found = {i: spans for i, text in enumerate(texts) if (spans := redactor.spans(text))}
    if not found:
        return {}
    befores = tokenizer.batch_decode([windows[i] for i in found], skip_special_tokens=False)
    carrying = {}
    for (i, spans), before in zip(found.items(), befores, strict=True):
        begin = _stable_length(before)  # where the draft's characters start
        touching = [span for span in spans if span.end > begin]
        if touching:
            carrying[drafts[i]] = touching[0].kind
    return carrying


def redact_record(
    row: dict, redactor: Redactor, tokenizer, mask_id: int | None
) -> tuple[dict, Counter[str]]:
    """``row`` with its secrets redacted (a new dict; ``row`` is not modified) and the
    count of secrets by kind. Raises :class:`RecordDropped` when it cannot be done safely.
    A record without secrets comes back equal to ``row``.

    A disagreement whose target token (its output position) or draft token carries a
    secret is removed and counted in ``masked_disagreements``; a rejected drafted token
    that carries one becomes ``mask_id``, as does an output one on or beside a masked
    position."""
    prompt_ids = list(row["prompt_token_ids"])
    output_ids = list(row["output_token_ids"])
    n_prompt = len(prompt_ids)
    ids = prompt_ids + output_ids
    redacted, masked, counts = redact_ids(ids, redactor, tokenizer, mask_id)
    prompt_text, prompt_counts = redactor.redact_text(row["prompt"])
    output_text, output_counts = redactor.redact_text(row["output_text"])
    for kind in prompt_counts | output_counts:  # a field's secrets, when more than seen in ids
        counts[kind] = max(counts[kind], prompt_counts[kind] + output_counts[kind])
    for item in row["disagreements"]:
        where = n_prompt + item["position"]
        context = list(item["context"])
        if ids[where - len(context) : where] != context:
            raise RecordDropped(
                f"a disagreement's context at output position {item['position']} does not "
                "match the record's tokens",
                "context_mismatch",
            )
    starts = _step_starts(row["from_draft"])

    def drafted_at(item: dict) -> int:  # the output position a drafted token was ruled at
        step = item["step"]
        return (starts[step] if step < len(starts) else len(output_ids)) + item["position"]

    rejected = [(n_prompt + d["position"], d["draft_token"]) for d in row["disagreements"]]
    rejected += [
        (n_prompt + drafted_at(d), d["token"]) for d in row["drafted"] if not d["accepted"]
    ]
    carrying = _draft_carries(redactor, tokenizer, redacted, rejected)
    for kind in set(carrying.values()):
        counts[kind] = max(counts[kind], 1)
    if not counts:
        return row, counts
    if mask_id is None:
        raise RecordDropped(
            "the tokenizer has no unknown or padding token to mask secrets with", "no_mask_token"
        )
    copied = _copied_secret_ids(tokenizer, ids, masked) if masked else set()

    def draft_masked(where: int, token: int) -> bool:
        return (where, token) in carrying or token in copied

    out_masked = {i - n_prompt for i in masked if i >= n_prompt}
    new = dict(row)
    new["prompt"], new["output_text"] = prompt_text, output_text
    new["prompt_id"] = "live-" + hashlib.sha256(prompt_text.encode()).hexdigest()[:16]
    new["prompt_token_ids"] = redacted[:n_prompt]
    new["output_token_ids"] = redacted[n_prompt:]
    disagreements, removed = [], 0
    for item in row["disagreements"]:
        where = n_prompt + item["position"]
        if item["position"] in out_masked or draft_masked(where, item["draft_token"]):
            removed += 1
            continue
        context = redacted[where - len(item["context"]) : where]
        disagreements.append(dict(item, context=context))
    new["disagreements"] = disagreements
    new["masked_disagreements"] = row.get("masked_disagreements", 0) + removed
    drafted = []
    for item in row["drafted"]:
        position = drafted_at(item)
        near = {position - 1, position, position + 1} & out_masked
        if near or (not item["accepted"] and draft_masked(n_prompt + position, item["token"])):
            drafted.append(dict(item, token=mask_id))
        else:
            drafted.append(dict(item))
    new["drafted"] = drafted
    return new, counts


def pair_redactor(
    redactor: Redactor, tokenizer, mask_id: int | None, *, on_event=None
) -> Callable[[dict], dict | None]:
    """A transform for captured request/response pairs of token ids (the vLLM front's):
    the prompt and output ids redacted as one sequence, positions kept; a pair that cannot
    be redacted safely becomes None (dropped). ``on_event(kind, n)`` hears each secret kind
    found and each drop (``dropped:<kind>``)."""
    notify = on_event or (lambda kind, n: None)

    def transform(row: dict) -> dict | None:
        prompt, output = list(row["prompt_token_ids"]), list(row["output_token_ids"])
        try:
            ids, _, counts = redact_ids(prompt + output, redactor, tokenizer, mask_id)
        except RecordDropped as error:
            notify(f"dropped:{error.kind}", 1)
            return None
        for kind, n in counts.items():
            notify(kind, n)
        if not counts:
            return row
        return {
            **row,
            "prompt_token_ids": ids[: len(prompt)],
            "output_token_ids": ids[len(prompt) :],
        }

    return transform
