"""Build the global corpus of the suffix drafter from collected traffic.

The corpus is the target's own outputs (``output_token_ids``; with ``include_prompts`` each
prompt is prepended to its output as one sequence) of the valid train-split records under a
store, oldest first. It is saved as one JSON file, written atomically, with a manifest (how
many sequences and tokens, which collection runs they came from) and a checksum; the
serving side (:func:`serving.engine.drafters.suffix.load_suffix_corpus`, spec ``suffix:PATH``)
rebuilds the suffix automaton from it on load. Rebuilding the corpus from a store is cheap,
so the loop simply rebuilds it after each collection.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

from serving.atomic import atomic_writer
from serving.engine.drafters.suffix import MAX_INDEX_TOKENS, SuffixCorpus, load_suffix_corpus
from serving.errors import BadInputError
from serving.records.schema import RequestRecord
from tasks.data.store_view import read_valid_records

log = logging.getLogger(__name__)


def _sequences(
    items: Iterable[RequestRecord | Sequence[int]],
    *,
    include_prompts: bool,
    splits: Collection[str],
) -> tuple[list[list[int]], list[str]]:
    """Token sequences (oldest record first) and the run ids they came from."""
    records: list[RequestRecord] = []
    sequences: list[list[int]] = []
    for item in items:
        if isinstance(item, RequestRecord):
            records.append(item)
        elif isinstance(item, str | bytes) or not isinstance(item, Sequence):
            raise BadInputError(
                f"expected request records or token id lists, got {type(item).__name__}"
            )
        else:
            sequences.append([int(t) for t in item])
    run_ids: set[str] = set()
    for record in sorted(records, key=lambda r: r.timestamp):
        if record.split not in splits:
            continue
        prompt = list(record.prompt_token_ids) if include_prompts else []
        sequences.append(prompt + list(record.output_token_ids))
        run_ids.add(record.run_id)
    return [s for s in sequences if s], sorted(run_ids)


def build_suffix_index(
    source: Iterable[RequestRecord | Sequence[int]],
    path: str | Path,
    *,
    include_prompts: bool = False,
    splits: Collection[str] = ("train",),
    max_tokens: int = MAX_INDEX_TOKENS,
    description: str = "",
) -> SuffixCorpus:
    """Write the corpus of ``source`` to ``path`` atomically and return it.

    ``source`` holds request records (:class:`serving.records.schema.RequestRecord`: their
    ``output_token_ids``, of ``splits`` only, oldest first) and/or plain token id lists
    (taken as they come). When the corpus exceeds ``max_tokens`` the oldest sequences are
    dropped. An empty corpus raises :class:`BadInputError`.
    """
    if isinstance(splits, str):
        raise BadInputError(f"splits must be a collection of split names, got {splits!r}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadInputError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    sequences, run_ids = _sequences(source, include_prompts=include_prompts, splits=splits)
    if not sequences:
        raise BadInputError(
            f"no token sequences to index (splits {sorted(splits)}): collect traffic first, "
            "or pass token id lists"
        )
    kept, total = [], 0
    for sequence in reversed(sequences):  # newest first, until the cap
        if total + len(sequence) > max_tokens:
            break
        kept.append(sequence)
        total += len(sequence)
    kept.reverse()
    if len(kept) < len(sequences):
        log.warning(
            "suffix corpus: kept the newest %d of %d sequences (max_tokens=%d)",
            len(kept),
            len(sequences),
            max_tokens,
        )
    if not kept:
        raise BadInputError(
            f"the newest sequence alone has {len(sequences[-1])} tokens, over "
            f"max_tokens={max_tokens}; raise max_tokens"
        )
    corpus = SuffixCorpus(
        tuple(tuple(s) for s in kept),
        {
            "built_at": time.time(),
            "run_ids": run_ids,
            "include_prompts": include_prompts,
            "splits": sorted(splits),
            "dropped_sequences": len(sequences) - len(kept),
            "description": description,
        },
    )
    save_suffix_index(corpus, path)
    log.info("suffix corpus: %d sequences, %d tokens -> %s", len(kept), total, path)
    return corpus


def build_suffix_index_from_store(
    root: str | Path, path: str | Path, *, hardware_name: str | None = None, **options
) -> SuffixCorpus:
    """:func:`build_suffix_index` over the records of the store at ``root`` that parse
    (:func:`tasks.data.store_view.read_valid_records`), only those stored under
    ``hardware_name`` when given."""
    records = read_valid_records(root, hardware_name=hardware_name)
    return build_suffix_index(records, path, **options)


def save_suffix_index(corpus: SuffixCorpus, path: str | Path) -> None:
    """Write ``corpus`` as compact JSON, atomically (temporary file + rename)."""
    with atomic_writer(Path(path)) as handle:
        json.dump(corpus.to_payload(), handle, separators=(",", ":"))


def load_suffix_index(path: str | Path) -> SuffixCorpus:
    """Read a corpus file; :class:`serving.errors.ModelSourceError` if missing or corrupt."""
    return load_suffix_corpus(path)
