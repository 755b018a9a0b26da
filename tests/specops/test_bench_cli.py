"""``specops bench-skeleton``, ``bench`` and ``profile``: bad input ends in one line naming
it, exit 2, before any model is loaded or a results file is written (their measurements
take minutes on the shipped model; :mod:`tasks.bench` is tested on the tiny target)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from specops.cli import app

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--drafter", "magic"], "unknown drafter 'magic'"),
        (["--policy", "magic"], "unknown policy 'magic'"),
        (["--k", "0"], "k must be between 1 and 64, got 0"),
        (["--hardware", "tpu"], "unknown hardware target 'tpu'"),
        (["--hardware", "cpu-vllm"], "runs on the 'vllm' backend"),
        (["--threads", "0"], "threads must be an integer >= 1"),
    ],
)
def test_bench_skeleton_refuses_bad_options_before_loading(args, fragment, tmp_path):
    out = tmp_path / "skeleton.json"
    result = runner.invoke(app, ["bench-skeleton", *args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert fragment in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_bench_refuses_unknown_methods_naming_the_configs(tmp_path):
    result = runner.invoke(app, ["bench", "--methods", "nope,hf-greedy", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "unknown methods ['nope']; the config has ['hf-greedy'," in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--hardware", "tpu"], "unknown hardware target 'tpu'"),
        (["--hardware", "cpu-vllm", "--batch"], "runs on the 'vllm' backend"),
        (["--kernels", "int3"], "int3"),
    ],
)
def test_profile_refuses_bad_targets_before_measuring(args, fragment, tmp_path):
    out = tmp_path / "profile.json"
    result = runner.invoke(app, ["profile", *args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert fragment in result.output and "Traceback" not in result.output
    assert not out.exists()
