"""Scenario loading: refusals name the dotted field; the example config loads and runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from serving.errors import BadInputError
from serving.paths import CONFIG_DIR
from tasks.simulate.config import load_scenario, parse_scenario
from tasks.simulate.model import simulate
from tasks.simulate.report import summarise, write_report

EXAMPLE = CONFIG_DIR / "simulate.yaml"


def _raw() -> dict[str, Any]:
    return {
        "targets": [{"name": "t", "one_token_pass_s": 0.05, "batch_curve": [[1, 1.0], [8, 2.0]]}],
        "drafters": [{"name": "d", "k": 2, "acceptance_by_position": [0.8, 0.6]}],
        "arrivals": {"kind": "poisson", "rate_per_s": 1.0},
        "duration_s": 10.0,
    }


def _refusal(raw: dict[str, Any]) -> str:
    with pytest.raises(BadInputError) as caught:
        parse_scenario(raw)
    return str(caught.value)


def test_unknown_router_is_refused_by_name() -> None:
    assert "router:" in _refusal({**_raw(), "router": "random"})


def test_negative_rate_is_refused_by_name() -> None:
    raw = _raw()
    raw["arrivals"]["rate_per_s"] = -1.0
    assert "arrivals.poisson.rate_per_s" in _refusal(raw)


def test_device_without_profile_or_curve_is_refused_by_name() -> None:
    raw = _raw()
    del raw["targets"][0]["batch_curve"]
    message = _refusal(raw)
    assert "targets.0" in message and "batch_curve" in message and "profile" in message


def test_other_refusals_name_their_field() -> None:
    raw = _raw()
    raw["targets"][0]["speed"] = 2  # extra field
    assert "targets.0.speed" in _refusal(raw)
    raw = _raw()
    raw["drafters"][0]["k"] = 3  # more drafts than acceptance probabilities
    assert "acceptance_by_position" in _refusal(raw)
    raw = _raw()
    raw["arrivals"] = {"kind": "trace", "timestamps": [1.0, 0.5]}
    assert "arrivals.trace.timestamps" in _refusal(raw)
    raw = _raw()
    raw["link"] = {"rtt_s": -0.1}
    assert "link.rtt_s" in _refusal(raw)


def test_profile_gives_curve_and_pass_time(tmp_path: Path) -> None:
    profile = {
        "table": [{"rows": 1, "sequences": 1, "pass_s": 0.04, "cost": 1.0}],
        "batch_curve": [[1, 1.0], [4, 1.5]],
    }
    (tmp_path / "p.json").write_text(json.dumps(profile))
    raw = _raw()
    raw["targets"][0] = {"name": "t", "profile": "p.json"}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    target = load_scenario(tmp_path / "s.yaml").targets[0]
    assert target.one_token_pass_s == 0.04
    assert target.batch_curve == [(1, 1.0), (4, 1.5)]
    raw["targets"][0]["profile"] = "missing.json"
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(BadInputError, match=r"targets\.0.*profile"):
        load_scenario(tmp_path / "s.yaml")


def test_example_config_runs_and_reports(tmp_path: Path) -> None:
    scenario = load_scenario(EXAMPLE)
    target = scenario.targets[0]
    assert target.profile is not None
    measured = json.loads((EXAMPLE.parent / target.profile).read_text())
    one = next(r for r in measured["table"] if (r["rows"], r["sequences"]) == (1, 1))
    assert target.one_token_pass_s == one["pass_s"]  # read from the profile it names
    assert target.pass_table and target.prefill_curve  # its whole table and its prefills
    small = scenario.model_copy(
        update={
            "duration_s": 30.0,
            "arrivals": scenario.arrivals.model_copy(
                update={"max_requests": 20, "rate_per_s": 2.0}
            ),
        }
    )
    report = summarise(simulate(small))
    assert report["requests"] == 20
    assert report["finished"] == 20
    for key in ("throughput_tokens_per_s", "goodput_requests_per_s", "ttft_s", "tpot_s"):
        assert key in report
    assert set(report["ttft_s"]) == {"mean", "p50", "p90", "p99"}
    assert report["throughput_tokens_per_s"] > 0
    for server in report["servers"].values():
        assert {"queue_depth", "rows_utilisation", "batch_utilisation", "busy"} <= set(server)
        assert 0 < server["batch_utilisation"] <= 1
    assert summarise(simulate(small)) == report  # deterministic for its seed
    write_report(report, tmp_path / "report.json")
    assert json.loads((tmp_path / "report.json").read_text())["requests"] == 20
