"""``specops cascade``: ``collect`` checks its options before any model loads; the λ sweep is
a study now (``python -m benchmarks.cascade_sweep``), not a command."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from specops.cascade_cli import cascade_app

app = typer.Typer()
app.add_typer(cascade_app, name="cascade")


def invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--stages", "pld:3,medusa", "medusa"),
        ("--workloads", "sharegpt,poetry", "poetry"),
        ("--hardware", "tpu-v9", "tpu-v9"),
    ],
)
def test_collect_refuses_bad_options_before_a_model_loads(tmp_path, option, value, message):
    result = invoke(
        "cascade", "collect", option, value, "--target", tmp_path / "no-model",
        "--store", tmp_path / "store", "--prompts", 1, "--heldout-prompts", 0,
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and message in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "store").exists()


def test_the_sweep_is_no_longer_a_command():
    result = invoke("cascade", "sweep")
    assert result.exit_code == 2 and "No such command 'sweep'" in result.output


def test_collect_writes_one_detailed_record_per_prompt_and_stage_and_reruns_idempotently(
    long_context_folder, tmp_path
):
    """Every stage alone, fixed k, detailed: each prompt once per stage, its drafted rows
    labelled with the stage; the same run id again writes nothing new."""
    from serving.records.schema import parse_record
    from serving.records.store import read_raw

    store = tmp_path / "store"
    model_folder = long_context_folder
    args = (
        "cascade", "collect", "--stages", "pld:3,ngram:4", "--workloads", "grounded",
        "--prompts", 2, "--heldout-prompts", 1, "--k", 4, "--max-new-tokens", 8,
        "--threads", 1, "--target", model_folder, "--store", store,
    )  # fmt: skip
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    assert "pld:3: 3 records written, 0 already there" in first.output
    assert "ngram:4: 3 records written, 0 already there" in first.output
    records = [parse_record(row) for _, row in read_raw(store)]
    by_drafter: dict[str, list] = {}
    for record in records:
        by_drafter.setdefault(record.drafter, []).append(record)
    assert sorted(by_drafter) == ["ngram(n=4,fallback=stop)", "pld(n=1..3)"]
    for drafter, rows in by_drafter.items():
        assert sorted(r.split for r in rows) == ["heldout", "train", "train"]
        assert all(r.policy.startswith("fixed") for r in rows)
        stage = drafter.partition("(")[0]  # each stage's rows carry its own stage name
        assert {d.stage for r in rows for d in r.drafted} == {stage}

    again = invoke(*args)
    assert again.exit_code == 0, again.output
    assert "pld:3: 0 records written, 3 already there" in again.output
    assert len(list(read_raw(store))) == 6
