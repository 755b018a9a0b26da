"""ShareGPT: parsing the cut-off real file, the pairs cache and the prompts
(tasks/data/sharegpt.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving import atomic
from serving.errors import BadInputError
from tasks.data import sharegpt
from tasks.data.sharegpt import (
    iter_json_array_records,
    parse_sharegpt_pairs,
    sharegpt_pairs,
    sharegpt_prompts,
)

# ------------------------------------------------------------------- ShareGPT parsing


def test_truncated_real_file_is_parsed_record_by_record(sharegpt_file: Path) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(sharegpt_file.read_text(encoding="utf-8"))
    parsed = parse_sharegpt_pairs(sharegpt_file, progress=False)
    assert len(parsed) > 10_000
    assert len({p.conversation_id for p in parsed}) == len(parsed)
    assert all(
        sharegpt.HUMAN_MIN_CHARS <= len(p.human) <= sharegpt.HUMAN_MAX_CHARS and p.gpt
        for p in parsed
    )


def test_cached_pairs_equal_a_fresh_parse(pairs, sharegpt_file: Path) -> None:
    assert sharegpt.pairs_cache_file(sharegpt_file).is_file()
    assert pairs == tuple(parse_sharegpt_pairs(sharegpt_file, progress=False))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[{"a": 1}, {"b": 2}, {"c": "cut here', [{"a": 1}, {"b": 2}]),
        ("[1, 2]", [1, 2]),
        ("  [\n]", []),
        ("[1, ", [1]),
        ('[{"a": [1, 2', []),
    ],
)
def test_json_array_records_stop_cleanly_at_a_cut(text: str, expected: list) -> None:
    assert list(iter_json_array_records(text)) == expected


def test_json_array_records_need_an_array() -> None:
    with pytest.raises(BadInputError, match="no '\\['"):
        list(iter_json_array_records('{"a": 1}'))


# -------------------------------------------------------------------- ShareGPT cache


@pytest.fixture
def small_sharegpt(tmp_path: Path, sharegpt_file: Path, monkeypatch) -> Path:
    """The first 2 MB of the real file (cut mid-record, like the original), cache in tmp."""
    monkeypatch.setenv("SPECOPS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sharegpt, "_PAIRS_MEMO", {})
    source = tmp_path / "sharegpt_head.json"
    with sharegpt_file.open("rb") as handle:
        source.write_bytes(handle.read(2_000_000))
    return source


def _cache_entries(tmp_path: Path) -> list[str]:
    folder = tmp_path / "cache" / "data"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_cache_is_created_once_and_reused(small_sharegpt: Path, tmp_path: Path, monkeypatch):
    first = sharegpt_pairs(source=small_sharegpt, progress=False)
    assert 100 < len(first) < 1000
    assert first == tuple(parse_sharegpt_pairs(small_sharegpt, progress=False))
    cache_file = sharegpt.pairs_cache_file(small_sharegpt)
    assert _cache_entries(tmp_path) == [cache_file.name]  # no temporary file left behind
    assert cache_file.parent == tmp_path / "cache" / "data"

    def no_parse(*args, **kwargs):
        raise AssertionError("the cache should have been reused")

    monkeypatch.setattr(sharegpt, "parse_sharegpt_pairs", no_parse)
    monkeypatch.setattr(sharegpt, "_PAIRS_MEMO", {})
    assert sharegpt_pairs(source=small_sharegpt, progress=False) == first


def test_changed_source_gets_a_new_cache_entry(small_sharegpt: Path, tmp_path: Path) -> None:
    sharegpt_pairs(source=small_sharegpt, progress=False)
    old_file = sharegpt.pairs_cache_file(small_sharegpt)
    with small_sharegpt.open("ab") as handle:
        handle.write(b" ")
    assert sharegpt.pairs_cache_file(small_sharegpt) != old_file
    sharegpt_pairs(source=small_sharegpt, progress=False)
    assert len(_cache_entries(tmp_path)) == 2


def test_failed_cache_write_leaves_nothing_behind(
    small_sharegpt: Path, tmp_path: Path, monkeypatch
) -> None:
    def failing_replace(src, dst):
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(atomic.os, "replace", failing_replace)  # the one atomic writer
        with pytest.raises(OSError, match="disk full"):
            sharegpt_pairs(source=small_sharegpt, progress=False)
    assert _cache_entries(tmp_path) == []
    assert len(sharegpt_pairs(source=small_sharegpt, progress=False)) > 100
    assert len(_cache_entries(tmp_path)) == 1


def test_incomplete_cache_is_rebuilt(small_sharegpt: Path, monkeypatch) -> None:
    pairs_before = sharegpt_pairs(source=small_sharegpt, progress=False)
    cache_file = sharegpt.pairs_cache_file(small_sharegpt)
    lines = cache_file.read_text(encoding="utf-8").splitlines(keepends=True)
    cache_file.write_text("".join(lines[:-5]), encoding="utf-8")
    monkeypatch.setattr(sharegpt, "_PAIRS_MEMO", {})
    assert sharegpt_pairs(source=small_sharegpt, progress=False) == pairs_before
    assert len(cache_file.read_text(encoding="utf-8").splitlines()) == len(lines)


def test_missing_source_is_a_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match=r"nope\.json"):
        sharegpt_pairs(source=tmp_path / "nope.json")


# -------------------------------------------------------------------------- prompts


def test_sharegpt_texts_never_cross_splits(pairs) -> None:
    everything = sharegpt_prompts(8000, seed=0, split="all")
    texts = {"train": set(), "heldout": set()}
    for prompt in everything:
        texts[prompt.split].add(" ".join(prompt.messages[0]["content"].split()).casefold())
    assert texts["train"] and texts["heldout"]
    assert not texts["train"] & texts["heldout"]


def test_sharegpt_prompts_respect_max_chars(pairs) -> None:
    prompts = sharegpt_prompts(200, seed=3, max_prompt_chars=300)
    assert all(len(p.messages[0]["content"]) <= 300 for p in prompts)
    by_id = {f"sharegpt:{pair.conversation_id}:0": pair for pair in pairs}
    for prompt in prompts:
        pair = by_id[prompt.id]
        assert prompt.messages[0]["content"] == pair.human
        assert prompt.reference == pair.gpt


def test_too_short_max_prompt_chars_is_rejected() -> None:
    with pytest.raises(BadInputError, match="max_prompt_chars"):
        sharegpt_prompts(5, seed=0, max_prompt_chars=3)
