"""`specops simulate`: the example scenario runs and writes its report; a bad scenario is
refused with the field named and exit code 2; `simulate acceptance`, `trace` and
`calibrate` turn records and measured runs into a scenario's sections and a comparison."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from serving.paths import CONFIG_DIR, PROJECT_ROOT
from specops.cli import app

runner = CliRunner()


def test_the_example_scenario_writes_a_report_a_plot_and_an_mlflow_run(tmp_path, registry_env):
    out = tmp_path / "simulate.json"
    result = runner.invoke(app, ["simulate", "--out", str(out), "--mlflow"])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["finished"] == report["requests"] > 0
    assert report["throughput_tokens_per_s"] > 0 and report["ttft_s"]["p50"] > 0
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    from registry.client import Registry

    registry = Registry()
    (run,) = registry.client.search_runs(
        [registry.experiment_id], filter_string="tags.report = 'simulate'"
    )
    assert run.data.metrics["throughput_tokens_per_s"] == report["throughput_tokens_per_s"]


def test_a_bad_scenario_is_refused_naming_the_field(tmp_path):
    scenario = yaml.safe_load((CONFIG_DIR / "simulate.yaml").read_text())
    scenario["router"] = "fastest"
    scenario["targets"][0]["profile"] = str(CONFIG_DIR / scenario["targets"][0]["profile"])
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(scenario))
    result = runner.invoke(app, ["simulate", "--config", str(path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert "router" in result.output


def _tiny_scenario(tmp_path):
    scenario = {
        "targets": [{"name": "t", "one_token_pass_s": 0.05, "batch_curve": [[1, 1.0], [8, 2.0]]}],
        "drafters": [{"name": "d", "k": 2, "acceptance_by_position": [0.8, 0.5]}],
        "arrivals": {"kind": "closed", "clients": 1, "think_s": 0.5, "output_tokens": 8},
        "duration_s": 10.0,
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(scenario))
    return path


def test_a_sweep_writes_its_files_and_logs_nested_mlflow_runs(tmp_path, registry_env):
    out = tmp_path / "sweep"
    args = ["simulate", "--config", str(_tiny_scenario(tmp_path)), "--out", str(out)]
    result = runner.invoke(
        app, [*args, "--sweep", "drafts=1,3", "--targets", "1,2", "--mlflow", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    assert len(json.loads((out / "sweep.json").read_text())["table"]) == 4
    assert (out / "sweep.png").exists() and "| drafts |" in result.output
    from registry.client import Registry

    registry = Registry()
    parent_id = result.output.split("logged to MLflow run ")[1].split()[0]
    children = registry.client.search_runs(
        [registry.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'"
    )
    assert len(children) == 4
    assert {f.path for f in registry.client.list_artifacts(parent_id)} >= {"sweep.png"}


def test_sweep_options_without_a_sweep_are_refused(tmp_path):
    args = ["simulate", "--config", str(_tiny_scenario(tmp_path)), "--targets", "1,2"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "--sweep" in result.output


def test_acceptance_from_records_prints_and_writes_a_drafters_section(tmp_path):
    records = tmp_path / "records.jsonl"
    rows = [{"drafter": {"name": "pld"}, "steps": [[2, 2], [2, 0]]}]
    records.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "drafters.yaml"
    result = runner.invoke(
        app, ["simulate", "acceptance", "--records", str(records), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    written = yaml.safe_load(out.read_text())
    assert written["drafters"] == [
        {
            "name": "pld",
            "k": 2,
            "acceptance_by_position": [0.5, 1.0],
            "draft_s_per_token": 0.0,
            "share": 1.0,
            "block_shares": [0.0, 0.0, 1.0],  # both steps proposed 2
        }
    ]
    assert written["evidence"][0]["trials"] == [2, 1]
    assert "acceptance_by_position" in result.output
    missing = runner.invoke(app, ["simulate", "acceptance", "--records", str(tmp_path / "no")])
    assert missing.exit_code == 2 and "neither a file nor a folder" in missing.output


def _capture_row(n: int, *, at: float, workload: str, prompt: int, output: int) -> dict:
    """A stored record (schema version 2) as the server's capture writes it."""
    return {
        "schema_version": 2, "id": f"r{n}", "prompt_id": f"p{n}", "workload": workload,
        "split": "train", "prompt": "p", "prompt_token_ids": list(range(prompt)),
        "output_text": "o", "output_token_ids": [5] * output, "from_draft": [False] * output,
        "acceptance_rate": None, "mean_accepted_length": None, "draft_tokens": 0,
        "accepted_tokens": 0, "checks": output, "steps": [[0, 0]] * output,
        "is_failure": False, "failure_threshold": 0.5, "drafter": "pld",
        "drafter_version": "builtin", "policy": "fixed", "hardware": "cpu",
        "sampling": {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": None},
        "timestamp": at, "run_id": "test", "disagreements": [], "drafted": [], "unverified": [],
    }  # fmt: skip


def test_trace_prints_and_writes_the_arrivals_of_one_workload(tmp_path):
    records = tmp_path / "records.jsonl"
    rows = [
        _capture_row(0, at=1_700_000_010.5, workload="sharegpt", prompt=4, output=2),
        _capture_row(1, at=1_700_000_000.0, workload="sharegpt", prompt=2, output=3),
        _capture_row(2, at=1_700_000_004.0, workload="humaneval", prompt=3, output=1),
    ]
    records.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "arrivals.yaml"
    args = ["--records", str(records), "--workload", "sharegpt", "--out", str(out)]
    result = runner.invoke(app, ["simulate", "trace", *args])
    assert result.exit_code == 0, result.output
    arrivals = yaml.safe_load(result.stdout)["arrivals"]
    assert arrivals["timestamps"] == [0.0, 10.5]  # in time order, rebased, sharegpt only
    assert arrivals["prompt_tokens"] == [1, 3] and arrivals["output_tokens"] == [3, 2]
    assert "2 requests over 10.5 s" in result.stderr
    assert out.read_text() == result.stdout
    other = runner.invoke(app, ["simulate", "trace", "--records", str(records), "--hardware", "x"])
    assert other.exit_code == 2 and "no records of hardware 'x'" in other.output


def test_trace_refuses_engine_records(tmp_path):
    records = tmp_path / "records.jsonl"
    records.write_text(json.dumps({"drafter": {"name": "pld"}, "steps": [[2, 2]]}) + "\n")
    result = runner.invoke(app, ["simulate", "trace", "--records", str(records)])
    assert result.exit_code == 2
    assert "is an engine record without a timestamp" in result.output
    assert "Traceback" not in result.output


def test_calibrate_predicts_measured_points_and_logs_the_comparison(tmp_path, registry_env):
    measured = json.loads((PROJECT_ROOT / "measurements" / "distributed-bench.json").read_text())
    measured["points"] = measured["points"][:2]  # plain and distributed, one session
    bench = tmp_path / "distributed.json"
    bench.write_text(json.dumps(measured))
    out = tmp_path / "calibration.json"
    profile = PROJECT_ROOT / "measurements" / "profile-batch-1thread.json"
    args = ["--bench", str(bench), "--profile", str(profile), "--out", str(out), "--mlflow"]
    result = runner.invoke(app, ["simulate", "calibrate", *args])
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    assert [(r["mode"], r["sessions"]) for r in written["rows"]] == [
        ("plain", 1),
        ("distributed", 1),
    ]
    assert written["bench"] == str(bench) and written["summary"]["scenarios"] == 2
    assert "| plain | 0 | 1 |" in result.stdout and "| distributed | 0 | 1 |" in result.stdout
    assert "simulating plain 0 ms x1" in result.stderr
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    from registry.client import Registry

    registry = Registry()
    (run,) = registry.client.search_runs(
        [registry.experiment_id], filter_string="tags.report = 'simulator-calibration'"
    )
    assert run.data.metrics["scenarios"] == 2.0
    assert f"logged MLflow run {run.info.run_id}" in result.stderr


def test_calibrate_refuses_an_unreadable_bench(tmp_path):
    result = runner.invoke(app, ["simulate", "calibrate", "--bench", str(tmp_path / "none.json")])
    assert result.exit_code == 2
    assert "cannot read the bench results" in result.output and "none.json" in result.output
