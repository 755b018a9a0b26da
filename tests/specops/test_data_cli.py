"""``specops data ...``: build-traffic, collect, validate, acceptance through the Typer app."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from serving.atomic import write_jsonl_atomic
from serving.records.schema import RequestRecord, Sampling
from serving.records.store import partition_dir, read_raw
from specops.cli import app

runner = CliRunner()

TINY_PARAMS = """\
traffic:
  workloads: [humaneval, grounded]
  train_prompts_per_workload: 2
  heldout_prompts_per_workload: 1
  seed: 0
collect:
  max_new_tokens: 8
dataset:
  failure_share: 0.5
tracker:
  window: 3
  threshold: 0.5
"""


def _params(tmp_path: Path, text: str = TINY_PARAMS) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def _invoke(*args: object):
    return runner.invoke(app, ["data", *map(str, args)])


def _record(index: int, accepted: int, *, workload: str = "grounded", split: str = "train"):
    """A valid record of 2 checks that proposed 2 drafts each and kept ``accepted``."""
    steps = [[2, min(accepted, 2)], [2, max(accepted - 2, 0)]]
    rate = accepted / 4
    return RequestRecord(
        schema_version=3,
        id=f"req-{index}",
        prompt_id=f"p{index}",
        workload=workload,
        split=split,
        prompt="Fix the grammar.",
        prompt_token_ids=[1, 2, 3],
        output_text="...",
        output_token_ids=list(range(10, 12 + accepted)),
        from_draft=[True] * accepted + [False, False],
        acceptance_rate=rate,
        mean_accepted_length=(accepted + 2) / 2,
        draft_tokens=4,
        accepted_tokens=accepted,
        checks=2,
        steps=steps,
        is_failure=rate < 0.5,
        failure_threshold=0.5,
        drafter="pld(n=1..3)",
        drafter_version="builtin",
        policy="fixed",
        hardware="cpu",
        sampling=Sampling(temperature=0.0, top_k=0, top_p=1.0, seed=None),
        timestamp=time.time() - 3600 + index,
        run_id="r",
        disagreements=[],
        drafted=[],
        unverified=[],
    ).model_dump(mode="json")


@pytest.fixture
def store(tmp_path) -> Path:
    """Five good records (grounded: acceptance 0, 0.25, 0.25, then 1; sharegpt: 0.75) and
    two bad rows."""
    root = tmp_path / "store"
    rows = [
        _record(0, 0),
        _record(1, 1),
        _record(2, 1, split="heldout"),
        _record(3, 4),
        _record(4, 3, workload="sharegpt"),
        {**_record(5, 1), "checks": "two"},
    ]
    path = partition_dir(root, "cpu", time.time()) / "part-r-00000.jsonl"
    write_jsonl_atomic(path, rows)
    with path.open("a") as handle:
        handle.write("not json\n")
    return root


# ---------------------------------------------------------------------------- build-traffic


def test_build_traffic_writes_both_splits_per_params(tmp_path):
    out = tmp_path / "traffic"
    result = _invoke("build-traffic", "--params", _params(tmp_path), "--out", out)
    assert result.exit_code == 0, result.output
    assert f"train: 4 prompts -> {out / 'train.jsonl'}" in result.output
    assert f"heldout: 2 prompts -> {out / 'heldout.jsonl'}" in result.output
    for split, per_workload in (("train", 2), ("heldout", 1)):
        rows = [json.loads(line) for line in (out / f"{split}.jsonl").read_text().splitlines()]
        assert [r["workload"] for r in rows] == ["humaneval"] * per_workload + [
            "grounded"
        ] * per_workload
        assert {r["split"] for r in rows} == {split}
        assert all(r["messages"][0]["role"] == "user" for r in rows)
    first = (out / "train.jsonl").read_bytes()
    assert _invoke("build-traffic", "--params", _params(tmp_path), "--out", out).exit_code == 0
    assert (out / "train.jsonl").read_bytes() == first  # seeded: the same prompts again


def test_build_traffic_with_no_heldout_prompts(tmp_path):
    params = _params(
        tmp_path,
        TINY_PARAMS.replace("heldout_prompts_per_workload: 1", "heldout_prompts_per_workload: 0"),
    )
    out = tmp_path / "traffic"
    result = _invoke("build-traffic", "--params", params, "--out", out)
    assert result.exit_code == 0, result.output
    assert (out / "heldout.jsonl").read_text() == ""


# ------------------------------------------------------------------------------ bad inputs


@pytest.mark.parametrize("command", ["build-traffic", "collect", "validate", "acceptance"])
@pytest.mark.parametrize(
    "text, key",
    [("collect:\n  k: 0\n", "collect.k"), ("tracker:\n  window: 0\n", "tracker.window")],
)
def test_bad_params_exit_2_with_the_key_named(tmp_path, command, text, key):
    where = ["--out" if command == "build-traffic" else "--store", tmp_path / "x"]
    result = _invoke(command, "--params", _params(tmp_path, text), *where)
    assert result.exit_code == 2, result.output
    assert "error: invalid params in" in result.output
    assert key in result.output
    assert "Traceback" not in result.output


def test_missing_params_file_exits_2(tmp_path):
    result = _invoke("build-traffic", "--params", tmp_path / "nope.yaml", "--out", tmp_path)
    assert result.exit_code == 2
    assert "cannot read params file" in result.output


def _traffic(tmp_path: Path) -> Path:
    folder = tmp_path / "traffic"
    assert _invoke("build-traffic", "--params", _params(tmp_path), "--out", folder).exit_code == 0
    return folder


def test_collect_without_traffic_exits_2(tmp_path):
    result = _invoke(
        "collect", "--params", _params(tmp_path), "--traffic", tmp_path / "none", "--store",
        tmp_path / "store",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "traffic file" in result.output and "run build-traffic" in result.output


def test_collect_with_a_damaged_traffic_file_names_the_line(tmp_path):
    folder = _traffic(tmp_path)
    with (folder / "heldout.jsonl").open("a") as handle:
        handle.write('{"id": "x"}\n')
    result = _invoke("collect", "--params", _params(tmp_path), "--traffic", folder)
    assert result.exit_code == 2
    assert f"{folder / 'heldout.jsonl'}:3: not a prompt record" in result.output


@pytest.mark.parametrize(
    "setting, fragment",
    [
        ("hardware: tpu", "unknown hardware target 'tpu'"),
        ("drafter: foo", "unknown drafter 'foo'"),
    ],
)
def test_collect_refuses_bad_options_before_loading_the_model(tmp_path, setting, fragment):
    folder = _traffic(tmp_path)
    params = _params(tmp_path, TINY_PARAMS.replace("collect:\n", f"collect:\n  {setting}\n"))
    result = _invoke("collect", "--params", params, "--traffic", folder, "--store", tmp_path)
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert not (tmp_path / "records").exists()


# ------------------------------------------------------------------- validate, acceptance


def test_validate_prints_counts_and_writes_the_dataset(tmp_path, store):
    out = tmp_path / "dataset"
    result = _invoke("validate", "--params", _params(tmp_path), "--store", store, "--out", out)
    assert result.exit_code == 0, result.output
    assert f"validated 7 records: 5 valid, 2 quarantined -> {out / 'quarantine.jsonl'}" in (
        result.output
    )
    # The newest grounded train record is held out by time (heldout_share 0.2); of the rest,
    # failures at acceptance 0 and 0.25, and failure_share 0.5 wants two replayed successes:
    # one is left.
    assert "dataset: failures=2, replay=1, train_mix=3, trainable=3, eval=1, heldout_traffic=1" in (
        result.output
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["validation"]["valid"] == 5
    assert summary["dataset"] == {
        "failures": 2, "replay": 1, "train_mix": 3, "trainable": 3, "eval": 1,
        "heldout_traffic": 1,
    }  # fmt: skip
    assert len((out / "quarantine.jsonl").read_text().splitlines()) == 2


def test_validate_writes_the_summary_and_plots_where_asked(tmp_path, store):
    summary, plots = tmp_path / "metrics" / "validation.json", tmp_path / "plots"
    result = _invoke(
        "validate", "--params", _params(tmp_path), "--store", store, "--out", tmp_path / "ds",
        "--summary", summary, "--plots", plots,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(summary.read_text())["validation"]["total"] == 7
    assert not (tmp_path / "ds" / "summary.json").exists()
    assert {p.name for p in plots.iterdir()} == {
        "acceptance_by_position.json",
        "acceptance_by_workload.json",
    }
    # grounded's last three requests: (1 + 1 + 4) / 12 = 0.5, not below the threshold.
    assert "retrain is wanted" not in result.output


def test_acceptance_prints_a_line_per_group(tmp_path, store):
    result = _invoke("acceptance", "--params", _params(tmp_path), "--store", store)
    assert result.exit_code == 0, result.output
    lines = [line.split() for line in result.stdout.splitlines()]
    assert lines == [
        ["grounded", "cpu", "0.500", "over", "3", "requests"],
        ["sharegpt", "cpu", "0.750", "over", "1", "requests"],
    ]
    assert "skipped 2 malformed records" in result.stderr


def test_acceptance_flags_a_retrain_and_prints_json(tmp_path, store):
    params = _params(tmp_path, TINY_PARAMS.replace("threshold: 0.5", "threshold: 0.8"))
    result = _invoke("acceptance", "--params", params, "--store", store)
    assert result.exit_code == 0, result.output
    flagged = [line for line in result.stdout.splitlines() if "<- retrain wanted" in line]
    assert [line.split()[0] for line in flagged] == ["grounded", "sharegpt"]
    result = _invoke("acceptance", "--params", params, "--store", store, "--json")
    groups = json.loads(result.stdout)
    assert [(g["workload"], g["acceptance"], g["retrain_wanted"]) for g in groups] == [
        ("grounded", 0.5, True),
        ("sharegpt", 0.75, True),
    ]
    assert groups[0]["series"] == [0.0, 0.125, 1 / 6, 0.5]


def test_acceptance_of_an_empty_store_prints_nothing(tmp_path):
    result = _invoke("acceptance", "--params", _params(tmp_path), "--store", tmp_path / "none")
    assert result.exit_code == 0
    assert result.output == ""


# ------------------------------------------------------------------------ the real model


@pytest.mark.real_model
def test_collect_validate_acceptance_on_the_real_model(tmp_path):
    params = _params(
        tmp_path,
        "traffic:\n  workloads: [grounded]\n  train_prompts_per_workload: 1\n"
        "  heldout_prompts_per_workload: 1\ncollect:\n  max_new_tokens: 8\n",
    )
    traffic, store = tmp_path / "traffic", tmp_path / "store"
    assert _invoke("build-traffic", "--params", params, "--out", traffic).exit_code == 0
    summary_path = tmp_path / "metrics" / "collect.json"
    args = ["--params", params, "--traffic", traffic, "--store", store, "--run-id", "t"]
    result = _invoke("collect", *args, "--summary", summary_path)
    assert result.exit_code == 0, result.output
    assert "collected 2 records" in result.output
    summary = json.loads(summary_path.read_text())
    assert (summary["run_id"], summary["prompts"], summary["written"]) == ("t", 2, 2)
    rows = [row for _, row in read_raw(store)]
    assert len(rows) == 2
    assert {r["split"] for r in rows} == {"train", "heldout"}
    for row in rows:
        record = RequestRecord.model_validate(row)
        assert 1 <= len(record.output_token_ids) <= 8
        assert record.hardware == "cpu" and record.workload == "grounded"
        assert record.output_text.strip()

    again = _invoke("collect", *args)
    assert again.exit_code == 0, again.output
    assert "collected 0 records" in again.output and "2 already in the store" in again.output

    out = tmp_path / "dataset"
    result = _invoke("validate", "--params", params, "--store", store, "--out", out)
    assert result.exit_code == 0, result.output
    assert "validated 2 records: 2 valid, 0 quarantined" in result.output
    result = _invoke("acceptance", "--params", params, "--store", store, "--json")
    assert result.exit_code == 0, result.output
    (group,) = json.loads(result.stdout)
    assert (group["workload"], group["hardware"], group["requests"]) == ("grounded", "cpu", 2)


# ------------------------------------------------------------------------------- retention


def _old_part(root: Path) -> Path:
    """A part of two records written 40 days ago."""
    when = time.time() - 40 * 86_400
    rows = [{**_record(10 + i, 2), "id": f"old-{i}", "timestamp": when + i} for i in range(2)]
    path = partition_dir(root, "cpu", when) / "part-old-00000.jsonl"
    write_jsonl_atomic(path, rows)
    return path


def test_retention_removes_old_parts_and_the_copies_a_dry_run_only_says_so(tmp_path, store):
    old, out = _old_part(store), tmp_path / "dataset"
    params = _params(tmp_path)
    assert _invoke("validate", "--params", params, "--store", store, "--out", out).exit_code == 0
    args = ["retention", "--store", store, "--dataset", out, "--days", 30]
    dry = _invoke(*args, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "would remove 1 parts older than 30 days (before " in dry.output
    assert "records 1 (2 rows)" in dry.output
    assert f"{out}: 1 validated batches to rewrite, 0 to drop; 2 copied rows and " in dry.output
    assert "nothing changed (--dry-run)" in dry.output and old.exists()

    result = _invoke(*args)
    assert result.exit_code == 0, result.output
    assert "removed 1 parts older than 30 days" in result.output and not old.exists()
    assert f"{out}: 1 validated batches rewritten, 0 dropped; 2 copied rows" in result.output
    trainable = (out / "trainable.jsonl").read_text()
    assert "old-0" not in trainable and "req-0" in trainable
    again = _invoke("validate", "--params", params, "--store", store, "--out", out)
    assert again.exit_code == 0, again.output
    assert "validated 7 records" in again.output  # the store's own, as before the old part
    assert "nothing in" in _invoke(*args).output


def test_retention_defaults_to_the_dataset_folders_there_are(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    old = _old_part(Path("data"))
    out = Path("data/dataset")  # `data validate`'s default
    assert _invoke("validate", "--params", _params(tmp_path)).exit_code == 0
    result = _invoke("retention", "--days", "7.5")
    assert result.exit_code == 0, result.output
    assert "older than 7.5 days" in result.output and not old.exists()
    assert f"{out}: 0 validated batches rewritten, 1 dropped; 2 copied rows" in result.output
    assert ".specops" not in result.output and not Path(".specops").exists()
    summary = json.loads(_invoke("retention", "--json").output)  # configs/store.yaml: 30
    assert (summary["max_age_days"], summary["removed"]) == (30.0, [])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--days", "-1"], "error: retention days must be a positive number of days, got -1.0"),
        (["--days", "0"], "got 0.0"),
        (["--days", "nan"], "a finite number"),
        (["--store", "nowhere"], "error: no store at 'nowhere'"),
    ],
)
def test_retention_refuses_bad_input_with_one_line(tmp_path, args, message):
    _old_part(tmp_path / "store")
    result = _invoke("retention", "--store", tmp_path / "store", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


# ------------------------------------------------------------------------------ version

DVC = str(Path(sys.executable).with_name("dvc"))


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A git + DVC project with a store and a local default remote; the working directory."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    remote = tmp_path / "remote"
    repo = tmp_path / "repo"
    repo.mkdir()
    for command in (["git", "init", "-q"], [DVC, "init", "-q"],
                    [DVC, "remote", "add", "-d", "local", str(remote)]):  # fmt: skip
        subprocess.run(command, cwd=repo, check=True, env=env)
    write_jsonl_atomic(partition_dir(repo / "data", "cpu", time.time()) / "part-r-00000.jsonl",
                       [_record(0, 2)])  # fmt: skip
    monkeypatch.chdir(repo)
    return repo, remote


def test_version_snapshots_the_store_and_pushes_it(project):
    repo, remote = project
    result = _invoke("version", "--store", "data", "--no-push")
    assert result.exit_code == 0, result.output
    digest = yaml.safe_load((repo / "data.dvc").read_text())["outs"][0]["md5"]
    assert digest.endswith(".dir")
    assert f"data versioned as {digest}; `git add data.dvc` to record it" in result.output
    assert not remote.exists()  # --no-push
    again = _invoke("version", "--store", "data")  # nothing new: the same version, pushed
    assert again.exit_code == 0 and digest in again.output
    assert any(p.is_file() for p in remote.rglob("*"))


def test_version_refuses_a_store_that_is_not_there(project):
    result = _invoke("version", "--store", "nowhere", "--no-push")
    assert result.exit_code == 2
    assert "error: nothing to version: 'nowhere' is not a folder" in result.output
