"""The cascade λ sweep (``python -m benchmarks.cascade_sweep``) end to end on a tiny model
with the real tokenizer: every method's rows, lossless methods equal to plain, pass@1
executed; bad settings, from the config or the command line, refused before a model
loads."""

from __future__ import annotations

import json

import pytest

from benchmarks.cascade_sweep import (
    ABLATIONS,
    BASELINE,
    LOSSLESS,
    PLAIN,
    CascadeFile,
    SweepConfig,
    TargetCascade,
    load_cascade_config,
    main,
    run_sweep,
    sweep_metrics,
    with_overrides,
)
from serving.errors import BadInputError
from tests.serving.engine.cascade.conftest import tiny_predictor


def _config(predictor, **sweep) -> CascadeFile:
    settings = {
        "hardware": "cpu",
        "predictor": str(predictor),
        "lambdas": [0.5, "inf"],
        "seeds": [0, 1],
        "humaneval_prompts": 1,
        "sharegpt_prompts": 1,
        "humaneval_max_new_tokens": 12,
        "sharegpt_max_new_tokens": 12,
        "threads": 1,
        "baseline": {"drafter": "pld:3", "policy": "cost", "k": 4},
        "single_stage": "pld:2",
        **sweep,
    }
    return CascadeFile(
        targets={"cpu": TargetCascade(stages="pld:2,layers:1", k_max=4)},
        sweep=SweepConfig.model_validate(settings),
    )


@pytest.mark.slow  # every method over real prompts
def test_sweep_runs_every_method_and_lossless_ones_match_plain(long_context_folder, tmp_path):
    predictor = tiny_predictor().save(tmp_path / "predictor")
    payload = run_sweep(
        _config(predictor),
        tmp_path / "out",
        target_source=str(long_context_folder),
        progress=False,
    )
    names = {PLAIN, BASELINE, LOSSLESS, "λ=0.5", *ABLATIONS}
    assert set(payload["summary"]) == names
    saved = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert (tmp_path / "out" / "frontier.png").stat().st_size > 0
    runs = saved["runs"]
    assert len(runs) == len(names) * 2 * 2  # methods x seeds x (1 humaneval + 1 sharegpt)
    for run in runs:
        if run["method"] != "λ=0.5":
            assert run["identical"], run  # every lossless method decodes what plain does
        if run["workload"] == "humaneval":
            assert run["passed"] in (True, False)
    lossless = saved["summary"][LOSSLESS]
    assert lossless["identical_share"] == 1.0 and lossless["unverified_share"] == 0.0
    assert sum(lossless["stops"].values()) == pytest.approx(1.0)
    assert "speedup" in payload["table"]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"lambdas": [0.5]}, "must include inf"),
        ({"lambdas": [0, "inf"]}, "λ must be in"),
        ({"hardware": "tpu-v9"}, "no cascade for hardware target 'tpu-v9'"),
    ],
)
def test_bad_settings_are_refused_before_a_model_loads(tmp_path, change, message):
    predictor = tiny_predictor().save(tmp_path / "predictor")
    with pytest.raises((BadInputError, ValueError), match=message):
        run_sweep(_config(predictor, **change), tmp_path / "out", target_source="/nonexistent")


def test_the_shipped_config_loads_and_the_command_line_overrides_it():
    shipped = load_cascade_config()
    assert shipped.sweep.hardware in shipped.targets
    changed = with_overrides(shipped, hardware="cpu-int4", seeds="3, 4", prompts=2)
    assert changed.sweep.hardware == "cpu-int4" and changed.sweep.seeds == [3, 4]
    assert changed.sweep.humaneval_prompts == changed.sweep.sharegpt_prompts == 2
    assert changed.targets == shipped.targets and with_overrides(shipped) is shipped


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seeds", "0,x"], "--seeds takes integers such as 0,1,2, got '0,x'"),
        (["--prompts", "-1"], "bad sweep setting"),
        (["--hardware", "tpu-v9"], "no cascade for hardware target 'tpu-v9'"),
        (["--config", "/nonexistent.yaml"], "cannot read cascade config"),
    ],
)
def test_the_command_refuses_bad_settings_before_a_model_loads(args, message, capsys):
    assert main([*args, "--target", "/nonexistent", "--no-mlflow"]) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error


def test_sweep_metrics_name_each_method_and_skip_what_it_lacks():
    def row(speedup, passed, rouge):
        return {"speedup": {"mean": speedup}, "pass_at_1": passed, "rouge_l": {"mean": rouge}}

    summary = {"λ=0.5": row(1.4, 0.5, 0.9), "plain": row(1.0, None, 1.0)}
    assert sweep_metrics(summary) == {
        "lambda_0.5/speedup": 1.4,
        "lambda_0.5/pass_at_1": 0.5,
        "lambda_0.5/rouge_l": 0.9,
        "plain/speedup": 1.0,
        "plain/rouge_l": 1.0,
    }
