"""The learning-curve study on the tiny target: each design trains to each mark, is scored
on held-out answers, resumes where it stopped, and the report draws it; its command
(``python -m benchmarks.draft_curves``) end to end on a tiny target folder."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from benchmarks.curves_report import POINTS_FILE, write_report
from benchmarks.draft_curves import (
    CurvesConfig,
    Design,
    answer_sequences,
    load_curves_config,
    main,
    package_design,
    run_design,
)
from serving.engine.drafters.package import load_package
from serving.errors import BadInputError
from serving.target import LoadedTarget
from tasks.train.teacher import TeacherConfig
from tasks.train.teacher_build import TeacherPrompt, build_teacher_cache

MARKS = [0.005, 0.01]  # minutes: 0.3 s and 0.6 s of optimiser steps


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def caches(target, tiny_teacher_cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("curves")

    def cache(name: str, n: int, seed: int):
        return tiny_teacher_cache(
            target, root / name, prompts=n, prompt_len=6, max_new_tokens=16, seed=seed,
            prefix=f"s{seed}-",
        )  # fmt: skip

    return cache("train", 24, 0), cache("heldout", 6, 1)


DESIGNS = {
    "head": Design(
        kind="head",
        settings={
            "batch_size": 4,
            "learning_rate": 1e-2,
            "intermediate_size": 48,
            "eval_fraction": 0.0,
        },
    ),
    "lora": Design(
        kind="lora",
        settings={"layers": 1, "batch_size": 4, "learning_rate": 1e-2, "eval_fraction": 0.0},
    ),
}


@pytest.mark.parametrize("name", list(DESIGNS))
def test_each_mark_is_trained_scored_and_kept(target, caches, tmp_path, name):
    train, heldout = caches
    settings = CurvesConfig(marks_minutes=MARKS, designs=DESIGNS)
    sequences = answer_sequences(heldout, target)
    kwargs = dict(
        target=LoadedTarget.of(target), teacher_dir=train, heldout=sequences,
        out_dir=tmp_path, progress=False, log=lambda line: None,
    )  # fmt: skip
    points = run_design(name, DESIGNS[name], settings, **kwargs)
    assert [p.minutes >= m for p, m in zip(points, MARKS, strict=True)] == [True, True]
    assert points[0].steps < points[1].steps and points[0].train_tokens < points[1].train_tokens
    for point in points:
        assert 0 <= point.agreement <= 1 and 1 <= point.mean_accepted_length <= 3
        assert point.heldout_positions == sum(s.tokens.shape[0] - s.prompt_len for s in sequences)
    saved = json.loads((tmp_path / name / POINTS_FILE).read_text())
    assert len(saved["points"]) == 2 and saved["kind"] == DESIGNS[name].kind

    again = run_design(name, DESIGNS[name], settings, **kwargs)  # nothing left to train
    assert again == points

    package = package_design(name, saved, tmp_path / "package", k=2)
    manifest, drafter = load_package(package, LoadedTarget.of(target))
    assert manifest.k == 2 and drafter is not None

    written = write_report(tmp_path, goal=1.6)
    assert written["plot"].stat().st_size > 0
    assert f"| {name} |" in written["table"].read_text()


def test_bad_settings_name_the_design(target, caches, tmp_path):
    train, heldout = caches
    bad = {"head": Design(kind="head", settings={"learning_rate": -1})}
    settings = CurvesConfig(marks_minutes=MARKS, designs=bad)
    with pytest.raises(BadInputError, match="design 'head' has bad settings"):
        run_design(
            "head", bad["head"], settings, target=LoadedTarget.of(target),
            teacher_dir=train, heldout=answer_sequences(heldout, target), out_dir=tmp_path,
        )  # fmt: skip


def test_the_shipped_config_loads_and_marks_must_increase(tmp_path):
    shipped = load_curves_config()
    assert {"head", "head-rv", "lora", "full"} <= set(shipped.designs)
    path = tmp_path / "curves.yaml"
    path.write_text("marks_minutes: [5, 2]\ndesigns: {h: {kind: head}}\n")
    with pytest.raises(BadInputError, match="positive and increasing"):
        load_curves_config(path)


def test_the_wall_clock_check_runs_every_design_and_prompt_lookup(model_folder, tmp_path):
    """A tiny target with the real tokenizer: the check decodes real held-out prompts."""
    from benchmarks.curves_report import SPEED_FILE
    from benchmarks.draft_curves import speed
    from serving.hardware import engine_target
    from serving.loader import load_target

    stock = load_target(str(model_folder), engine_target("cpu-stock"))
    generator = torch.Generator().manual_seed(0)
    prompts = [
        TeacherPrompt(f"r{i}", torch.randint(3, 49152, (6,), generator=generator).tolist())
        for i in range(8)
    ]
    build_teacher_cache(
        stock.model, prompts, tmp_path / "teacher", eos_token_ids=[2],
        config=TeacherConfig(max_new_tokens=8), progress=False,
    )  # fmt: skip
    design = Design(
        kind="head", settings={"intermediate_size": 32, "draft_vocab_size": 256, "eval_fraction": 0}
    )
    settings = CurvesConfig(marks_minutes=[0.002], designs={"head-rv": design})
    run_design(
        "head-rv", design, settings, target=stock, teacher_dir=tmp_path / "teacher",
        heldout=answer_sequences(tmp_path / "teacher", stock.model),
        out_dir=tmp_path / "curves", progress=False, log=lambda line: None,
    )  # fmt: skip
    report = speed(
        tmp_path / "curves", target=load_target(str(model_folder)), k=2, prompts=2,
        max_new_tokens=8, threads=1,
    )  # fmt: skip
    names = set(report["results"])
    assert names == {"plain", "head-rv", "pld:3 (cost policy, k <= 10)"}
    assert all(result["lossless"] for result in report["results"].values())
    assert (tmp_path / "curves" / SPEED_FILE).is_file()
    assert "Wall clock through the engine" in write_report(tmp_path / "curves")["table"].read_text()


CURVES = """
marks_minutes: [0.005]
threads: 1
designs:
  head: {kind: head, settings: {intermediate_size: 48, learning_rate: 0.01, eval_fraction: 0}}
"""


def test_draft_curves_trains_scores_and_draws(target_dir, tmp_path, capsys):
    """Was ``specops draft-curves`` (tests/specops/test_curves_cli.py); the teacher cache
    is built by ``specops teacher build`` as there."""
    from specops.teacher_cli import teacher_app

    generator = torch.Generator().manual_seed(5)
    rows = [
        {"id": f"q{i}", "token_ids": torch.randint(3, 96, (6,), generator=generator).tolist()}
        for i in range(12)
    ]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    built = CliRunner().invoke(
        teacher_app,
        ["build", "--prompts", str(prompts), "--out", str(tmp_path / "teacher"),
         "--target", str(target_dir), "--max-new-tokens", "12", "--threads", "1"],
    )  # fmt: skip
    assert built.exit_code == 0, built.output
    config = tmp_path / "curves.yaml"
    config.write_text(CURVES)
    out = tmp_path / "curves"
    common = ["--config", config, "--teacher", tmp_path / "teacher", "--heldout",
              tmp_path / "teacher", "--out", out, "--target", target_dir]  # fmt: skip

    def run(*args: object) -> tuple[int, str]:
        code = main([str(a) for a in (*common, *args)])
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    def assert_fails(result: tuple[int, str], fragment: str) -> None:
        code, output = result
        assert code == 2, output
        assert fragment in output and "Traceback" not in output

    code, output = run("--speed-prompts", 0)
    assert code == 0, output
    assert "| head | " in output
    assert {p.name for p in out.iterdir()} >= {"head", "curves.md", "curves.json", "curves.png"}
    assert_fails(run("--designs", "medusa"), "unknown designs")
    assert_fails(run("--speed-prompts", -1), "--speed-prompts")
    config.write_text("marks_minutes: []\ndesigns: {}\n")
    assert_fails(run(), "invalid draft-curves config")
