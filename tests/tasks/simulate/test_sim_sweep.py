"""Scale sweeps: how each axis changes the scenario, a small sweep's files, and its MLflow
runs (one parent, one nested run per point)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from serving.errors import BadInputError
from tasks.simulate.config import ClosedArrivals, PoissonArrivals, Scenario, parse_scenario
from tasks.simulate.sweep import (
    COLUMNS,
    log_sweep,
    parse_counts,
    parse_sweep,
    point_scenario,
    run_sweep,
)


def _scenario(arrivals: dict[str, Any]) -> Scenario:
    return parse_scenario(
        {
            "targets": [
                {"name": "a", "one_token_pass_s": 0.05, "batch_curve": [[1, 1.0], [8, 2.0]]},
                {"name": "b", "one_token_pass_s": 0.02, "batch_curve": [[1, 1.0], [8, 3.0]]},
            ],
            "drafters": [{"name": "d", "k": 2, "acceptance_by_position": [0.8, 0.5]}],
            "arrivals": arrivals,
            "duration_s": 20.0,
            "drain_s": 20.0,
        }
    )


def test_axes_parse_and_bad_ones_are_refused_by_name() -> None:
    assert parse_sweep("drafts=1,10, 100") == [1, 10, 100]
    assert parse_counts("1,2,4", name="--targets") == [1, 2, 4]
    with pytest.raises(BadInputError, match=r"--sweep.*KEY is one of drafts"):
        parse_sweep("clients=1,2")
    with pytest.raises(BadInputError, match="--sweep drafts"):
        parse_sweep("drafts=1,0")
    with pytest.raises(BadInputError, match=r"--targets.*integers"):
        parse_counts("1,two", name="--targets")
    with pytest.raises(BadInputError, match=r"--targets.*distinct"):
        parse_counts("2,2", name="--targets")


def test_a_point_scales_clients_or_rate_and_every_target_kind() -> None:
    closed = point_scenario(_scenario({"kind": "closed", "clients": 3}), 50, 4)
    assert isinstance(closed.arrivals, ClosedArrivals) and closed.arrivals.clients == 50
    assert [t.count for t in closed.targets] == [4, 4]
    poisson = point_scenario(_scenario({"kind": "poisson", "rate_per_s": 0.5}), 10, None)
    assert isinstance(poisson.arrivals, PoissonArrivals)
    assert poisson.arrivals.rate_per_s == pytest.approx(5.0)
    assert [t.count for t in poisson.targets] == [1, 1]
    with pytest.raises(BadInputError, match=r"arrivals\.kind.*trace"):
        point_scenario(_scenario({"kind": "trace", "timestamps": [0.0]}), 2, None)


def test_a_small_sweep_writes_its_table_plot_and_reports(tmp_path: Path) -> None:
    base = _scenario({"kind": "closed", "clients": 1, "think_s": 1.0, "output_tokens": 8})
    payload = run_sweep(base, [1, 4, 16], [1, 2], tmp_path, config="s.yaml", progress=False)
    table = payload["table"]
    assert [(r["drafts"], r["targets"]) for r in table] == [
        (1, 1), (4, 1), (16, 1), (1, 2), (4, 2), (16, 2),
    ]  # fmt: skip
    for row in table:
        assert {key for key, _, _ in COLUMNS} <= set(row)
        assert row["throughput_tokens_per_s"] > 0 and 0 < row["batch_utilisation"] <= 1
    one_target = [r["throughput_tokens_per_s"] for r in table if r["targets"] == 1]
    assert one_target == sorted(one_target)  # more clients, more tokens (unsaturated here)
    written = json.loads((tmp_path / "sweep.json").read_text())
    assert written["table"] == table and len(written["reports"]) == 6
    assert "servers" not in written["reports"][0]
    markdown = (tmp_path / "sweep.md").read_text().splitlines()
    assert markdown[0].startswith("| drafts | targets |") and len(markdown) == 2 + 6
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"


class _Runs:
    """Stands in for ``Registry.log_report``: records each call, returns a run id."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, name, files, *, metrics=None, tags=None) -> str:
        self.calls.append({"name": name, "files": files, "metrics": metrics, "tags": tags})
        return f"run{len(self.calls)}"


def test_log_sweep_nests_one_run_per_point_under_the_sweep(tmp_path: Path) -> None:
    base = _scenario({"kind": "closed", "clients": 1, "output_tokens": 4})
    payload = run_sweep(base, [1, 2], None, tmp_path, config="cfg/sim.yaml", progress=False)
    runs = _Runs()
    parent = log_sweep(runs, payload, tmp_path)
    assert parent == "run1"
    first, *points = runs.calls
    assert first["name"] == "simulate-sweep-sim"
    assert [p.name for p in first["files"]] == ["sweep.json", "sweep.md", "sweep.png"]
    assert [p["tags"]["mlflow.parentRunId"] for p in points] == ["run1", "run1"]
    assert [p["name"] for p in points] == ["drafts=1 targets=2", "drafts=2 targets=2"]
    assert points[0]["metrics"]["throughput_tokens_per_s"] > 0
