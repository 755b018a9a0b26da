"""The predictor's rows: picked from records' ``drafted`` rows, by hardware target, with the
refusals that say what to collect; the validation slice takes whole requests."""

from __future__ import annotations

import json

import pytest

from serving.engine.features import DraftedToken, TokenFeatures
from serving.errors import BadInputError
from serving.hardware import hardware_target
from serving.records.schema import RequestRecord, parse_record
from tasks.train.predictor_data import (
    FEATURE_FIELDS,
    LabelledRows,
    dataset_version,
    drafted_rows,
    heldout_rows,
    training_rows,
    validation_split,
)
from tests.tasks.data.test_validate import make_record

CPU = hardware_target("cpu")


def _drafted(accepted: bool, *, stage: str = "pld", position: int = 0) -> dict:
    return DraftedToken(
        stage=stage,
        stage_index=0,
        position=position,
        draft_confidence=0.5,
        draft_entropy=None,
        match_len=2,
        target_entropy=1.2,
        recent_logprob=-0.4,
        length_ratio=0.3,
        step=1,
        token=42,
        accepted=accepted,
        kept=accepted,
    ).to_dict()


def _stored(rid: str, drafted: list[dict] | None, *, hardware: str = "cpu", split="train") -> dict:
    """A record as stored; ``drafted=None``: one of schema version 1 (no drafted rows)."""
    record = make_record(0, id=rid, hardware=hardware, split=split, draft_tokens=3)
    if drafted is None:
        del record["drafted"], record["unverified"]
        return {**record, "schema_version": 1}
    return {**record, "drafted": drafted}


def _record(
    rid: str, drafted: list[dict] | None, *, hardware: str = "cpu", split="train"
) -> RequestRecord:
    return parse_record(_stored(rid, drafted, hardware=hardware, split=split))


def test_rows_pick_the_feature_fields_and_the_label():
    rows = drafted_rows(
        [_record("a", [_drafted(True), _drafted(False, position=1)]), _record("b", [])],
        hardware=CPU,
    )
    assert len(rows) == 2 and rows.labels == [True, False] and rows.groups == ["a", "a"]
    assert rows.features[1] == TokenFeatures(
        **{k: v for k, v in _drafted(False, position=1).items() if k in FEATURE_FIELDS}
    )
    assert (rows.records, rows.records_here, rows.unrecorded) == (2, 2, 1)
    assert set(FEATURE_FIELDS) < set(_drafted(True))  # step, token, kept are not features


def test_version_1_records_and_other_targets_add_no_rows():
    records = [_record("v1", None), _record("int8", [_drafted(True)], hardware="cpu-int8")]
    rows = drafted_rows(records, hardware=CPU)
    assert len(rows) == 0 and rows.unrecorded == 1 and rows.records_here == 1


def _dataset(tmp_path, train: list[RequestRecord], heldout: list[RequestRecord] | None = None):
    parts = {"trainable": train, "eval": heldout or [], "heldout_traffic": []}
    for name, records in parts.items():
        lines = "".join(json.dumps(r.model_dump(mode="json")) + "\n" for r in records)
        (tmp_path / f"{name}.jsonl").write_text(lines)
    return tmp_path


def test_a_row_without_a_feature_names_it(tmp_path):
    # Records are read as the schema defines them: a drafted row that lacks a feature is
    # refused where it is read, with its file, line and field.
    row = _drafted(True)
    del row["match_len"]
    folder = _dataset(tmp_path, [])
    (folder / "trainable.jsonl").write_text(json.dumps(_stored("a", [row])) + "\n")
    with pytest.raises(BadInputError, match=r"trainable.jsonl:1 .*drafted\.0\.match_len"):
        training_rows(folder, hardware=CPU)


def test_only_version_1_records_ask_for_schema_2(tmp_path):
    folder = _dataset(tmp_path, [_record("a", None), _record("b", [])])
    with pytest.raises(BadInputError, match="collected before schema v2") as error:
        training_rows(folder, hardware=CPU)
    assert "collect in detailed mode with schema v2" in str(error.value)


def test_no_records_of_the_target_are_named(tmp_path):
    folder = _dataset(tmp_path, [_record("a", [_drafted(True)], hardware="cpu-int4")])
    with pytest.raises(BadInputError, match="none collected on hardware target 'cpu'"):
        training_rows(folder, hardware=CPU)


@pytest.mark.parametrize("label, word", [(True, "accepted"), (False, "rejected")])
def test_one_label_only_is_refused(tmp_path, label, word):
    folder = _dataset(tmp_path, [_record("a", [_drafted(label)] * 3)])
    with pytest.raises(BadInputError, match=f"all 3 drafted rows .* were {word}.*both outcomes"):
        training_rows(folder, hardware=CPU)


def test_heldout_rows_come_from_the_heldout_parts(tmp_path):
    train = [_record("a", [_drafted(True), _drafted(False)])]
    folder = _dataset(tmp_path, train, [_record("h", [_drafted(False)], split="heldout")])
    assert heldout_rows(folder, hardware=CPU).groups == ["h"]
    (tmp_path / "none-held-out").mkdir()
    empty = _dataset(tmp_path / "none-held-out", train)
    with pytest.raises(BadInputError, match=r"no drafted rows in the held-out parts"):
        heldout_rows(empty, hardware=CPU)


def test_a_missing_part_says_how_to_build_it(tmp_path):
    with pytest.raises(BadInputError, match="build the dataset first"):
        training_rows(tmp_path, hardware=CPU)


def test_a_broken_line_is_named(tmp_path):
    folder = _dataset(tmp_path, [])
    good = json.dumps(_stored("a", [_drafted(True)]))
    (folder / "trainable.jsonl").write_text(good + "\nnot json\n")
    with pytest.raises(BadInputError, match=r"trainable.jsonl:2 is not JSON"):
        training_rows(folder, hardware=CPU)


def _rows(requests: int, per_request: int = 3) -> LabelledRows:
    features = drafted_rows([_record("x", [_drafted(True)])], hardware=CPU).features
    n = requests * per_request
    return LabelledRows(
        features * n, [i % 2 == 0 for i in range(n)], [f"r{i // per_request}" for i in range(n)]
    )


def test_the_validation_slice_takes_whole_requests():
    rows = _rows(40)
    fit, validation = validation_split(rows, 0.2, seed=0)
    assert len(fit) + len(validation) == len(rows)
    assert not set(fit.groups) & set(validation.groups)
    assert 2 <= len(set(validation.groups)) <= 16  # about a fifth of 40
    again = validation_split(rows, 0.2, seed=0)[1]
    assert again.groups == validation.groups  # seeded, stable
    assert validation_split(rows, 0.2, seed=1)[1].groups != validation.groups


def test_the_validation_slice_is_never_empty_nor_everything():
    assert len(set(validation_split(_rows(2), 0.01)[1].groups)) == 1
    fit, validation = validation_split(_rows(1), 0.5)
    assert len(fit) == 3 and len(validation) == 0
    assert len(validation_split(_rows(5), 0.0)[1]) == 0
    with pytest.raises(BadInputError, match="validation_fraction"):
        validation_split(_rows(5), 1.0)


def test_the_dataset_version_follows_the_bytes(tmp_path):
    folder = _dataset(tmp_path, [_record("a", [_drafted(True)])])
    first = dataset_version(folder, ("trainable", "eval"))
    assert first.startswith("dataset:") and first == dataset_version(folder, ("trainable", "eval"))
    (folder / "eval.jsonl").write_text(json.dumps(_stored("h", [])) + "\n")
    assert dataset_version(folder, ("trainable", "eval")) != first
