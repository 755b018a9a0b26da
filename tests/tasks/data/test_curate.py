"""curate(): validation, quarantine, dataset, plot data and summary from one store, repeatably.

The good records come from real collections on the tiny target (one flagging failures at
0.5, one at threshold 0, which flags none), the bad rows are appended by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.atomic import write_jsonl_atomic
from serving.hardware import hardware_target
from serving.records.store import part_files, partition_dir, read_raw
from tasks.data.collect import collect
from tasks.data.curate import curate
from tasks.data.dataset import PARTS


def _summary(*args, **kwargs) -> dict:
    """:func:`curate`'s summary as the JSON it is written as (``summary.json``)."""
    return curate(*args, **kwargs).model_dump(mode="json")


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (the dataset and its validation ledger) by relative path."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def store(tmp_path, pld_decoder, char_tokenizer, make_prompts) -> Path:
    root = tmp_path / "store"
    prompts = make_prompts()
    for run_id, threshold in (("fail", 0.5), ("ok", 0.0)):
        collect(
            prompts,
            decoder=pld_decoder,
            tokenizer=char_tokenizer,
            store_root=root,
            run_id=run_id,
            hardware=hardware_target("cpu"),
            max_new_tokens=12,
            failure_threshold=threshold,
            chunk_size=4,
            progress=False,
        )
    good = [row for _, row in read_raw(root)]
    missing = dict(good[0])
    del missing["prompt"]
    bad = [
        good[1],  # a second copy of a stored record
        {**good[2], "id": "tpu-copy", "hardware": "tpu-v9"},
        missing,
    ]
    path = partition_dir(root, "cpu", good[0]["timestamp"]) / "part-zz-00000.jsonl"
    write_jsonl_atomic(path, bad)
    with path.open("a") as handle:
        handle.write('{"id": "half a row\n')
    return root


def test_curate_writes_quarantine_dataset_plots_and_a_consistent_summary(tmp_path, store):
    out, plots = tmp_path / "dataset", tmp_path / "plots"
    summary = _summary(store, out, failure_share=0.8, seed=0, window=4, plots_dir=plots)

    validation = summary["validation"]
    assert validation["total"] == 12 + 4
    assert (validation["valid"], validation["quarantined"]) == (12, 4)
    assert validation["by_stage"] == {"parse": 2, "duplicate": 1, "expectations": 1}

    quarantine = _read_jsonl(out / "quarantine.jsonl")
    assert len(quarantine) == 4
    assert all(entry["reasons"] and entry["source"].startswith("records/") for entry in quarantine)
    reasons = {entry["stage"]: entry["reasons"] for entry in quarantine}
    assert reasons["duplicate"][0].startswith("duplicate id ")
    assert reasons["expectations"] == ["expect_column_values_to_be_in_set(hardware)"]
    assert ["prompt: Field required"] in [e["reasons"] for e in quarantine]
    assert ["not JSON"] in [e["reasons"] for e in quarantine]

    dataset = {name: _read_jsonl(out / f"{name}.jsonl") for name in PARTS}
    assert summary["dataset"] == {name: len(rows) for name, rows in dataset.items()}
    valid_ids = {r["id"] for r in (*dataset["train_mix"], *dataset["eval"])}
    assert "tpu-copy" not in valid_ids
    assert all(r["run_id"] == "fail" and r["is_failure"] for r in dataset["failures"])
    assert all(r["run_id"] == "ok" and not r["is_failure"] for r in dataset["replay"])
    assert len(dataset["train_mix"]) == len(dataset["failures"]) + len(dataset["replay"])
    assert dataset["failures"], "the random target should reject most drafts"
    assert len(dataset["replay"]) == round(len(dataset["failures"]) / 4)  # 80/20
    assert len(dataset["eval"]) == 4  # two held-out prompts, collected twice
    assert all(r["split"] == "heldout" for r in dataset["eval"])
    # The newest 20 % of the 8 train-split records (ceil(1.6) = 2), from the later run, are
    # held out by time and trained on nowhere.
    held = dataset["heldout_traffic"]
    assert len(held) == 2 and all(r["run_id"] == "ok" and r["split"] == "train" for r in held)
    trainable = [r for r in dataset["failures"] + dataset["replay"] if r["split"] == "train"]
    assert max(r["timestamp"] for r in trainable) <= min(r["timestamp"] for r in held)
    assert not {r["id"] for r in held} & {r["id"] for r in dataset["train_mix"]}

    assert summary["acceptance_rate"] is not None and 0.0 <= summary["acceptance_rate"] <= 1.0
    (group,) = summary["rolling_acceptance"]
    assert (group["workload"], group["hardware"], group["requests"]) == ("grounded", "cpu", 4)
    assert summary["retrain_wanted"] == group["retrain_wanted"]

    by_position = json.loads((plots / "acceptance_by_position.json").read_text())
    assert [p["position"] for p in by_position] == list(range(1, len(by_position) + 1))
    assert [p["acceptance"] for p in by_position] == summary["acceptance_by_position"]
    by_workload = json.loads((plots / "acceptance_by_workload.json").read_text())
    assert by_workload == [{"workload": "grounded@cpu", "acceptance": group["acceptance"]}]
    json.dumps(summary)  # JSON-ready


def test_curating_twice_gives_identical_files(tmp_path, store):
    outputs = []
    for attempt in ("a", "b"):
        out, plots = tmp_path / attempt / "dataset", tmp_path / attempt / "plots"
        summary = _summary(store, out, plots_dir=plots)
        outputs.append((summary, _files(out), _files(plots)))
    assert outputs[0] == outputs[1]
    # Curating into the same folder again replaces its files with the same content.
    out = tmp_path / "a" / "dataset"
    curate(store, out, plots_dir=tmp_path / "a" / "plots")
    assert _files(out) == outputs[0][1]


def test_curating_an_empty_store(tmp_path):
    summary = _summary(tmp_path / "empty", tmp_path / "out", plots_dir=tmp_path / "plots")
    assert summary["validation"]["total"] == 0
    assert summary["dataset"] == dict.fromkeys(PARTS, 0)
    assert summary["acceptance_rate"] is None
    assert summary["acceptance_by_position"] == []
    assert summary["rolling_acceptance"] == [] and summary["retrain_wanted"] is False
    assert (tmp_path / "out" / "quarantine.jsonl").read_text() == ""
    assert json.loads((tmp_path / "plots" / "acceptance_by_position.json").read_text()) == []
    assert json.loads((tmp_path / "plots" / "acceptance_by_workload.json").read_text()) == []


def test_curate_threads_heldout_share_and_refuses_a_bad_one(tmp_path, store):
    summary = _summary(store, tmp_path / "none", heldout_share=0.0)
    assert summary["dataset"]["heldout_traffic"] == 0
    summary = _summary(store, tmp_path / "half", heldout_share=0.5)
    assert summary["dataset"]["heldout_traffic"] == 4  # ceil(0.5 * 8)
    assert len(_read_jsonl(tmp_path / "half" / "heldout_traffic.jsonl")) == 4
    with pytest.raises(ValueError, match=r"heldout_share must be in \[0, 1\), got 1.0"):
        curate(store, tmp_path / "bad", heldout_share=1.0)
    assert not (tmp_path / "bad").exists()  # refused before anything was written


def _dataset_files(out: Path) -> dict[str, bytes]:
    return {
        name: (out / name).read_bytes()
        for name in (*(f"{p}.jsonl" for p in PARTS), "quarantine.jsonl")
    }


def _totals(summary: dict) -> dict:
    """The validation totals, less what says how this run got them."""
    run_only = ("mode", "full_reason", "new_parts", "new_rows", "new")
    return {k: v for k, v in summary["validation"].items() if k not in run_only}


def test_curating_new_parts_only_or_in_full_gives_the_fresh_dataset(tmp_path, store, monkeypatch):
    fresh = _summary(store, tmp_path / "fresh")
    # The same store, grown in two steps: the "ok" collection and the hand-made part later.
    later = [p for p in part_files(store) if not p.name.startswith("part-fail-")]
    aside = tmp_path / "aside"
    for path in later:
        (aside / path.relative_to(store)).parent.mkdir(parents=True, exist_ok=True)
        path.rename(aside / path.relative_to(store))
    out = tmp_path / "grown"
    first = _summary(store, out)
    assert first["validation"]["new_parts"] == first["validation"]["parts"] == 2
    for path in later:
        (aside / path.relative_to(store)).rename(path)

    # Interrupted after its ledger was committed, before the dataset was written ...
    def killed(dataset, out_dir):
        raise KeyboardInterrupt("killed before the dataset was written")

    with monkeypatch.context() as patched:
        patched.setattr("tasks.data.curate.write_dataset", killed)
        with pytest.raises(KeyboardInterrupt):
            curate(store, out)
    # ... the next run has no new part to validate and writes the dataset in full.
    repaired = _summary(store, out)
    assert (repaired["validation"]["mode"], repaired["validation"]["new_parts"]) == (
        "incremental",
        0,
    )
    assert repaired["validation"]["parts"] == 2 + len(later)
    assert _dataset_files(out) == _dataset_files(tmp_path / "fresh")
    assert _totals(repaired) == _totals(fresh)
    assert {k: v for k, v in repaired.items() if k != "validation"} == {
        k: v for k, v in fresh.items() if k != "validation"
    }

    revalidated = _summary(store, out, full=True)
    assert revalidated["validation"]["mode"] == "full"
    assert revalidated["validation"]["new_rows"] == fresh["validation"]["total"]
    assert _dataset_files(out) == _dataset_files(tmp_path / "fresh")
    assert _totals(revalidated) == _totals(fresh)
