"""``specops teacher build`` on the tiny target folder; ``specops teacher prompts`` on the
real model's tokenizer. (The learning curves that train on these caches are a study:
tests/benchmarks/test_draft_curves.py.)"""

from __future__ import annotations

import json

import pytest
import torch
import typer
from typer.testing import CliRunner

from specops.teacher_cli import teacher_app
from tasks.train.teacher import load_teacher_data

runner = CliRunner()
app = typer.Typer()
app.add_typer(teacher_app, name="teacher")


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def assert_fails(result, fragment: str) -> None:
    assert result.exit_code == 2, result.output
    assert fragment in result.output and "Traceback" not in result.output


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    generator = torch.Generator().manual_seed(5)
    rows = [
        {"id": f"q{i}", "token_ids": torch.randint(3, 96, (6,), generator=generator).tolist()}
        for i in range(12)
    ]
    return write_jsonl(tmp_path_factory.mktemp("prompts") / "prompts.jsonl", rows)


def build(target_dir, prompts_file, out, *extra):
    return invoke(
        "teacher", "build", "--prompts", prompts_file, "--out", out, "--target", target_dir,
        "--max-new-tokens", 12, "--threads", 1, *extra,
    )  # fmt: skip


def test_teacher_build_generates_or_takes_given_answers(target_dir, prompts_file, tmp_path):
    result = build(target_dir, prompts_file, tmp_path / "generated", "--count", 8)
    assert result.exit_code == 0, result.output
    assert "teacher cache" in result.output and "8 sequences" in result.output
    _, generated = load_teacher_data(tmp_path / "generated")
    answers = write_jsonl(
        tmp_path / "answers.jsonl",
        [{"id": s.prompt_id, "answer_ids": s.tokens[s.prompt_len :].tolist()} for s in generated],
    )
    result = build(target_dir, prompts_file, tmp_path / "given", "--count", 8, "--answers", answers)
    assert result.exit_code == 0, result.output
    _, given = load_teacher_data(tmp_path / "given")
    assert [s.tokens.tolist() for s in given] == [s.tokens.tolist() for s in generated]


def test_teacher_build_errors(target_dir, prompts_file, tmp_path):
    assert_fails(build(target_dir, prompts_file, tmp_path / "a", "--count", 0), "--count must be")
    missing = tmp_path / "nope.jsonl"
    assert_fails(
        build(target_dir, prompts_file, tmp_path / "a", "--answers", missing), "does not exist"
    )
    few = write_jsonl(tmp_path / "few.jsonl", [{"id": "q0", "answer_ids": [5]}])
    assert_fails(
        build(target_dir, prompts_file, tmp_path / "a", "--answers", few), "no given answer"
    )
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "q0"}])
    assert_fails(
        build(target_dir, prompts_file, tmp_path / "a", "--answers", bad), "bad.jsonl:1 lacks"
    )


@pytest.mark.real_model
def test_teacher_prompts_writes_chat_templated_sharegpt_prompts(tmp_path):
    out = tmp_path / "prompts.jsonl"
    result = invoke("teacher", "prompts", "--out", out, "--prompts", 3, "--split", "heldout")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(0 < len(r["token_ids"]) <= 128 for r in rows)
    assert_fails(invoke("teacher", "prompts", "--out", out, "--prompts", 10**6), "only")


def test_teacher_answers_are_the_served_greedy_answers(target_dir, prompts_file, tmp_path):
    from serving.engine.decoder import SpeculativeDecoder
    from serving.hardware import engine_target
    from serving.loader import load_target
    from tasks.train.teacher_answers import read_jsonl

    out = tmp_path / "answers.jsonl"
    result = invoke(
        "teacher", "answers", "--prompts", prompts_file, "--out", out, "--target", target_dir,
        "--hardware", "cpu-int4", "--threads", 1, "--max-new-tokens", 8, "--sequences", 5,
        "--batch", 7,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "answer tokens in this run for 12 prompts on cpu-int4" in result.output
    served = load_target(str(target_dir), engine_target("cpu-int4"))
    assert served.step is not None  # the lean step answered
    rows = read_jsonl(out, ("id", "answer_ids"))
    prompts = {row["id"]: row["token_ids"] for row in read_jsonl(prompts_file, ("id", "token_ids"))}
    assert sorted(row["id"] for row in rows) == sorted(prompts)
    for row in rows:
        alone = SpeculativeDecoder(served).generate(prompts[row["id"]], max_new_tokens=8)
        assert row["answer_ids"] == list(alone.token_ids)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--sequences", 0], "--sequences must be >= 1, got 0"),
        (["--batch", 0], "--batch must be >= 1, got 0"),
        (["--hardware", "abacus"], "abacus"),
    ],
)
def test_teacher_answers_refuses_bad_options(target_dir, prompts_file, tmp_path, extra, fragment):
    result = invoke(
        "teacher", "answers", "--prompts", prompts_file, "--out", tmp_path / "a.jsonl",
        "--target", target_dir, *extra,
    )  # fmt: skip
    assert_fails(result, fragment)


@pytest.mark.real_model
def test_teacher_prompts_leaves_out_the_reserved_training_prompts(tmp_path):
    from tasks.train.base_corpus import reserved_sources, source_of

    out = tmp_path / "corpus.jsonl"
    result = invoke(
        "teacher", "prompts", "--out", out, "--prompts", 300, "--reserve", 40,
        "--reserve-seed", 0,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "sources reserved" in result.output
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    reserved = reserved_sources(40, [0])
    assert len(ids) == 300 and not {source_of(i) for i in ids} & reserved
