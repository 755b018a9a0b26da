"""Building the suffix drafter's corpus from collected records: what goes in, the file, the
errors, and the drafter built from it through the factory."""

from __future__ import annotations

import json

import pytest

from serving.atomic import write_jsonl_atomic
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.factory import build_drafter
from serving.engine.drafters.suffix import SuffixDrafter
from serving.engine.policy import FixedK
from serving.errors import BadInputError, ModelSourceError
from serving.hardware import hardware_target
from serving.records.store import read_raw
from serving.target import LoadedTarget
from tasks.data.collect import collect
from tasks.data.store_view import read_valid_records
from tasks.train.suffix_index import (
    build_suffix_index,
    build_suffix_index_from_store,
    load_suffix_index,
)


def test_token_lists_roundtrip(tmp_path):
    path = tmp_path / "corpus" / "suffix.json"
    built = build_suffix_index([[1, 2, 3], (4, 5), []], path, description="hand-made")
    loaded = load_suffix_index(path)
    assert loaded == built
    assert loaded.sequences == ((1, 2, 3), (4, 5))  # empty sequences are dropped
    assert loaded.manifest["description"] == "hand-made"
    assert loaded.manifest["run_ids"] == []
    assert [p.name for p in path.parent.iterdir()] == ["suffix.json"]  # no temporaries left
    payload = json.loads(path.read_text())
    assert (payload["sequences"], payload["tokens"], payload["max_token_id"]) == (2, 5, 5)


def test_the_oldest_sequences_are_dropped_over_the_cap(tmp_path):
    built = build_suffix_index([[1, 2, 3], [4, 5], [6, 7]], tmp_path / "c.json", max_tokens=4)
    assert built.sequences == ((4, 5), (6, 7))
    assert built.manifest["dropped_sequences"] == 1
    with pytest.raises(BadInputError, match="raise max_tokens"):
        build_suffix_index([[1, 2, 3]], tmp_path / "c.json", max_tokens=2)


def test_empty_corpus_is_an_error_and_leaves_the_old_file(tmp_path):
    path = tmp_path / "c.json"
    build_suffix_index([[1, 2]], path)
    before = path.read_bytes()
    with pytest.raises(BadInputError, match="no token sequences"):
        build_suffix_index([], path)
    with pytest.raises(BadInputError, match="no token sequences"):
        build_suffix_index([[]], path)
    with pytest.raises(BadInputError, match="token id lists"):
        build_suffix_index(["12"], path)
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    ("content", "shown"),
    [
        (None, "does not exist"),
        ('{"format": "specops-suffix-corpus", "version": 1, "token_i', "cannot be read"),
        ("[1, 2]", "not a specops-suffix-corpus file"),
    ],
)
def test_loading_a_missing_or_corrupt_file_raises_model_source_error(tmp_path, content, shown):
    path = tmp_path / "c.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ModelSourceError, match=shown):
        load_suffix_index(path)


def test_a_flipped_token_fails_the_checksum(tmp_path):
    path = tmp_path / "c.json"
    build_suffix_index([[11, 12, 13]], path)
    path.write_text(path.read_text().replace("[[11,12,13]]", "[[11,12,14]]"))
    with pytest.raises(ModelSourceError, match="checksum"):
        load_suffix_index(path)


@pytest.fixture
def store(tmp_path, pld_decoder, char_tokenizer, make_prompts):
    """A store with one collection of the tiny target (every third prompt held out) and a
    malformed row."""
    root = tmp_path / "store"
    collect(
        make_prompts(),
        decoder=pld_decoder,
        tokenizer=char_tokenizer,
        store_root=root,
        run_id="run-1",
        hardware=hardware_target("cpu"),
        max_new_tokens=12,
        progress=False,
    )
    write_jsonl_atomic(
        root / "records" / "hardware=cpu" / "date=2020-01-01" / "part-bad.jsonl",
        [{"id": "broken"}],
    )
    return root


def test_builds_from_the_train_outputs_of_valid_records(tmp_path, store):
    records = read_valid_records(store)
    assert len(records) == 6 and len(list(read_raw(store))) == 7
    train = sorted((r for r in records if r.split == "train"), key=lambda r: r.timestamp)
    corpus = build_suffix_index_from_store(store, tmp_path / "c.json")
    assert corpus.sequences == tuple(tuple(r.output_token_ids) for r in train)
    assert corpus.manifest["run_ids"] == ["run-1"]
    assert corpus.manifest["splits"] == ["train"]
    with_prompts = build_suffix_index(records, tmp_path / "p.json", include_prompts=True)
    assert with_prompts.sequences == tuple(
        tuple(r.prompt_token_ids + r.output_token_ids) for r in train
    )
    with pytest.raises(BadInputError, match="no token sequences"):
        build_suffix_index_from_store(store, tmp_path / "x.json", hardware_name="gpu")
    heldout = [r for r in records if r.split == "heldout"]
    with pytest.raises(BadInputError, match=r"splits \['train'\]"):
        build_suffix_index(heldout, tmp_path / "x.json")


def test_the_built_corpus_serves_through_the_factory(tmp_path, store, target):
    path = tmp_path / "c.json"
    corpus = build_suffix_index_from_store(store, path)
    loaded = LoadedTarget.of(target)
    drafter = build_drafter(f"suffix:{path}", loaded)
    assert isinstance(drafter, SuffixDrafter) and drafter.global_index is not None
    assert drafter.describe()["global_sha256"] == corpus.checksum()
    # Replaying a collected train prompt: its own earlier output is in the corpus, so the
    # replay is greedy-identical and drafts from it.
    train = [r for r in read_valid_records(store) if r.split == "train"]
    record = max(train, key=lambda r: len(r.output_token_ids))
    assert len(record.output_token_ids) >= 4
    decoder = SpeculativeDecoder(loaded, drafter=drafter, policy=FixedK(4), eos_token_ids=[2])
    result = decoder.generate(record.prompt_token_ids, max_new_tokens=12)
    assert result.token_ids == record.output_token_ids
    assert result.stats.accepted_tokens > 0
