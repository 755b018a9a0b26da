"""``specops bench-skeleton``, ``bench`` and ``profile``: bad input ends in one line naming
it, exit 2, before any model is loaded or a results file is written (their measurements
take minutes on the shipped model; :mod:`tasks.bench` is tested on the tiny target)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specops.cli import app

runner = CliRunner()


@pytest.mark.parametrize(
    ("command", "args", "fragment"),
    [
        ("bench-skeleton", ["--drafter", "magic"], "unknown drafter 'magic'"),
        ("bench-skeleton", ["--policy", "magic"], "unknown policy 'magic'"),
        ("bench-skeleton", ["--k", "0"], "k must be between 1 and 64, got 0"),
        ("bench-skeleton", ["--hardware", "tpu"], "unknown hardware target 'tpu'"),
        ("bench-skeleton", ["--hardware", "cpu-vllm"], "runs on the 'vllm' backend"),
        ("bench-skeleton", ["--threads", "0"], "threads must be an integer >= 1"),
        ("bench", ["--methods", "nope,hf-greedy"], "unknown methods ['nope']; the config has"),
        ("profile", ["--hardware", "tpu"], "unknown hardware target 'tpu'"),
        ("profile", ["--hardware", "cpu-vllm", "--batch"], "runs on the 'vllm' backend"),
        ("profile", ["--kernels", "int3"], "unknown kernels 'int3'"),
        ("profile", ["--breakdown", "--rows", "1"], "--rows must be >= 2"),
        ("profile", ["--breakdown", "--hardware", "tpu"], "unknown hardware target 'tpu'"),
    ],
)
def test_bad_options_fail_before_any_measurement(command, args, fragment, tmp_path):
    out = tmp_path / "results"  # bench's folder, the others' file
    result = runner.invoke(app, [command, *args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert fragment in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_profile_pools_evaluations_curves_without_timing_anything(tmp_path):
    from tests.tasks.evaluate.test_priced import evaluation

    paths = []
    for index, curve in enumerate(([1.0, 1.1, 1.3], [1.0, 1.2, 1.5], [1.0, 1.4, 1.4])):
        report = evaluation().model_copy(
            update={"evaluated_curve": curve, "evaluated_passes": [50, 20, 10]}
        )
        paths.append(tmp_path / f"report-{index}.json")
        paths[-1].write_text(json.dumps(report.model_dump(mode="json")))
    out = tmp_path / "profile.json"
    options = [arg for path in paths for arg in ("--from-evaluation", str(path))]
    result = runner.invoke(app, ["profile", "--hardware", "cpu", *options, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "verify_curve: [1.0, 1.2, 1.4]" in result.output
    written = json.loads(out.read_text())
    assert written["config_curve"] == [1.0, 1.2, 1.4] and written["passes"] == 240
    # one from another target: refused, naming it, nothing written
    other = tmp_path / "other.json"
    result = runner.invoke(
        app, ["profile", "--hardware", "cpu-int4", *options, "--out", str(other)]
    )
    assert result.exit_code == 2 and "ran on 'cpu', not on 'cpu-int4'" in result.output
    assert not other.exists()
