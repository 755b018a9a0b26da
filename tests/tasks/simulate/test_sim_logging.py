"""What a simulation and a calibration put in their MLflow run: the report's own numbers
as metrics (not its nested sections, not booleans), its files, tags naming the source."""

from __future__ import annotations

from pathlib import Path

from tasks.simulate.calibrate import log_calibration
from tasks.simulate.report import headline, log_scenario


class Logger:
    """Stands in for Registry.log_report: records each call, returns a run id."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, name, files, *, metrics=None, tags=None) -> str:
        self.calls.append((name, files, metrics, tags))
        return f"run-{len(self.calls)}"


def test_a_scenario_logs_its_headline_numbers():
    report = {
        "requests": 12, "throughput_tokens_per_s": 40.5, "slo_met": True,
        "ttft_s": {"p50": 0.2}, "queue_depth": [1, 2], "mode": "colocated",
    }  # fmt: skip
    assert headline(report) == {"requests": 12.0, "throughput_tokens_per_s": 40.5}
    log = Logger()
    files = [Path("r/simulate.json"), Path("r/simulate.png")]
    assert log_scenario(log, report, files, Path("configs/simulate-sweep.yaml")) == "run-1"
    assert log.calls == [
        (
            "simulate-simulate-sweep",
            files,
            {"requests": 12.0, "throughput_tokens_per_s": 40.5},
            {"report": "simulate", "config": "configs/simulate-sweep.yaml"},
        )
    ]


def test_a_calibration_logs_its_summary_and_files():
    log = Logger()
    paths = {"json": Path("c.json"), "table": Path("c.md"), "plot": Path("c.png")}
    result = {"summary": {"scenarios": 2, "max_abs_throughput_error": 0.05}}
    assert log_calibration(log, result, paths, Path("results/distributed.json")) == "run-1"
    (name, files, metrics, tags) = log.calls[0]
    assert (name, files) == ("simulator-calibration", [Path("c.json"), Path("c.md"), Path("c.png")])
    assert metrics == {"scenarios": 2.0, "max_abs_throughput_error": 0.05}
    assert tags == {"report": "simulator-calibration", "bench": "results/distributed.json"}
