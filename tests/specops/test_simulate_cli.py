"""`specops simulate`: the example scenario runs and writes its report; a bad scenario is
refused with the field named and exit code 2."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from serving.paths import CONFIG_DIR
from specops.cli import app

runner = CliRunner()


def test_the_example_scenario_writes_a_report(tmp_path):
    out = tmp_path / "simulate.json"
    result = runner.invoke(app, ["simulate", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["finished"] == report["requests"] > 0
    assert report["throughput_tokens_per_s"] > 0 and report["ttft_s"]["p50"] > 0


def test_a_bad_scenario_is_refused_naming_the_field(tmp_path):
    scenario = yaml.safe_load((CONFIG_DIR / "simulate.yaml").read_text())
    scenario["router"] = "fastest"
    scenario["targets"][0]["profile"] = str(CONFIG_DIR / scenario["targets"][0]["profile"])
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(scenario))
    result = runner.invoke(app, ["simulate", "--config", str(path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert "router" in result.output
