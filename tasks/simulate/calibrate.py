"""Calibration: the simulator, configured from this machine's profile, predicts measured
runs (``specops simulate calibrate``, docs/simulator.md).

Each point of a ``specops distributed bench`` result (a mode, an injected RTT, a number of
concurrent sessions) becomes a scenario built only from what a planner would know:

- **the target** from a ``specops profile --batch`` result taken at the server's thread
  count and near the workload's context: every pass priced by its rows and requests (the
  profile's table), prompts by its measured prefills (an older profile without them: its
  longest one-sequence pass, per row). Nothing is fitted to the run being predicted;
- **the drafter**: acceptance by position and how often a round proposes 0, 1, ... drafts,
  estimated from the point's own steps (the simulator predicts time, not acceptance: it is
  given the acceptance the traffic had, as it would be from collected records), ``k`` from
  the bench's settings, and the drafting time per token measured on the clients;
- **arrivals**: ``sessions`` closed-loop clients sharing one queue of the point's requests,
  in order, with their prompt and output lengths;
- **the link**: the injected RTT (distributed mode; a fused session crosses the link only
  at its start and end, which the simulator leaves out);
- **batching**: the target server's own rule (``wait_for: sessions``) and window.

Predicted and measured are compared the same way: output tokens over the wall time of the
whole point (first request sent to last answer), and the median request latency.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, TypedDict

import numpy as np

from serving.atomic import atomic_path, write_json_atomic, write_text_atomic
from serving.errors import BadInputError
from tasks.distributed_records import BenchPoint, DistributedBenchResults
from tasks.json_types import JsonObject
from tasks.simulate.acceptance import DrafterSection, estimate_steps
from tasks.simulate.config import parse_scenario, read_prefill, read_profile
from tasks.simulate.model import simulate
from tasks.simulate.report import ReportLogger

THROUGHPUT_TARGET = 0.10  # |error| the issue asks for, on throughput
LATENCY_TARGET = 0.15  # and on p50 latency


class Prediction(TypedDict):
    """The simulator's figures for one point, as the bench measures them."""

    tokens_per_s: float  # output tokens over the makespan
    latency_p50_s: float


class CalibrationRow(TypedDict):
    """One bench point: measured against predicted, errors as predicted / measured - 1."""

    mode: str
    rtt_ms: float
    sessions: int
    measured_tokens_per_s: float
    predicted_tokens_per_s: float
    throughput_error: float
    measured_latency_p50_s: float
    predicted_latency_p50_s: float
    latency_p50_error: float


class CalibrationSummary(TypedDict):
    scenarios: int
    max_abs_throughput_error: float
    mean_abs_throughput_error: float
    max_abs_latency_p50_error: float
    mean_abs_latency_p50_error: float
    within_throughput_target: int
    within_latency_target: int


class CalibrationSettingsRecord(TypedDict):
    window_s: float
    max_batch: int
    max_tokens_per_pass: int
    seed: int


class Calibration(TypedDict):
    """What ``specops simulate calibrate`` writes (``bench``: the results file read, added
    by the command)."""

    profile: str
    prefill_s_per_token: float | None
    draft_s_per_token: float
    settings: CalibrationSettingsRecord
    rows: list[CalibrationRow]
    summary: CalibrationSummary
    bench: NotRequired[str]


@dataclass(frozen=True)
class CalibrationSettings:
    profile: Path
    window_s: float = 0.002
    max_batch: int = 8
    max_tokens_per_pass: int = 64
    seed: int = 0


def prefill_s_per_token(profile: Path) -> float | None:
    """None when the profile measured prefills (the simulator prices prompts along them);
    for an older profile, a prompt token's cost as its longest one-sequence pass's per
    row."""
    import json

    if read_prefill(Path(profile)):
        return None
    table = json.loads(Path(profile).read_text())["table"]
    single = [row for row in table if row["sequences"] == 1]
    if not single:
        raise BadInputError(f"profile {str(profile)!r} has no one-sequence passes")
    longest = max(single, key=lambda row: row["rows"])
    return float(longest["pass_s"]) / int(longest["rows"])


def point_scenario(
    point: BenchPoint,
    settings: CalibrationSettings,
    *,
    k: int,
    prefill_s: float | None,
    draft_s_per_token: float | None = None,
) -> JsonObject:
    """The scenario (a plain mapping, validated by :class:`Scenario`) for one point."""
    requests = sorted(point["per_request"], key=lambda r: r["prompt"])  # the send order
    if not requests:
        raise BadInputError(f"point {point['mode']} x{point['sessions']} has no requests")
    missing = [r["prompt"] for r in requests if "prompt_tokens" not in r]
    if missing:
        raise BadInputError(
            f"requests {missing[:5]} carry no prompt_tokens; re-run the bench (or pass "
            "prompt lengths)"
        )
    steps = [s for r in requests for s in r["steps"]]
    drafted = sum(p for p, _ in steps)
    plain = point["mode"] == "plain" or drafted == 0
    estimate = estimate_steps(steps, name=point["mode"])
    if draft_s_per_token is None:  # this point's own clients' drafting time
        draft_s_per_token = sum(r.get("draft_s", 0.0) for r in requests) / max(drafted, 1)
    drafter: DrafterSection = (
        {"name": "none", "k": 0, "acceptance_by_position": []}
        if plain
        else estimate.drafter_section(k=k, draft_s_per_token=draft_s_per_token)
    )
    target: dict[str, str | int | float] = {
        "name": "cpu",
        "profile": str(settings.profile),
        "max_batch": settings.max_batch,
        "max_tokens_per_pass": settings.max_tokens_per_pass,
        "count": 1,
    }
    if prefill_s is not None:
        target["prefill_s_per_token"] = prefill_s
    return {
        "targets": [target],
        "drafters": [drafter],
        "mode": "distributed" if point["mode"] == "distributed" else "fused",
        "router": "round_robin",
        "link": {"rtt_s": point["rtt_ms"] / 1000.0 if point["mode"] == "distributed" else 0.0},
        "arrivals": {
            "kind": "closed",
            "clients": point["sessions"],
            "lengths": "per_request",
            "prompt_tokens": [max(int(r["prompt_tokens"]) - 1, 0) for r in requests],
            "output_tokens": [int(r["output_tokens"]) for r in requests],
        },
        "batching": {"window_s": settings.window_s, "wait_for": "sessions"},
        "duration_s": 1e6,
        "drain_s": 0.0,
        "seed": settings.seed,
    }


def drafting_s_per_token(bench: DistributedBenchResults) -> float:
    """The drafter's time per drafted token, as the bench's lone distributed clients (its
    fewest-session points) measured it: a fused point's drafting runs on the server, where
    the bench cannot time it apart from the pass, and concurrent clients of one bench share
    its machine's cores, which a draft device does not. Every point gets this figure."""
    distributed = [p for p in bench["points"] if p["mode"] == "distributed"]
    fewest = min((p["sessions"] for p in distributed), default=0)
    seconds, drafted = 0.0, 0
    for point in distributed:
        if point["sessions"] != fewest:
            continue
        for request in point["per_request"]:
            seconds += request.get("draft_s", 0.0)
            drafted += sum(p for p, _ in request["steps"])
    return seconds / drafted if drafted else 0.0


def predict(scenario: JsonObject, label: str = "point") -> Prediction:
    """``tokens_per_s`` (output tokens over the makespan) and ``latency_p50_s``."""
    log = simulate(parse_scenario(scenario, source=label))
    finished = [r for r in log.requests if not math.isnan(r.finish_s)]
    if not finished:
        raise BadInputError("the simulated point finished no request")
    makespan = max(r.finish_s for r in finished) - min(r.arrival_s for r in log.requests)
    tokens = sum(r.output_tokens for r in finished)
    latencies = [r.finish_s - r.arrival_s for r in finished]
    return {
        "tokens_per_s": tokens / makespan,
        "latency_p50_s": float(np.percentile(latencies, 50)),
    }


def calibrate(
    bench: DistributedBenchResults,
    settings: CalibrationSettings,
    *,
    progress: Callable[[str], None] | None = None,
) -> Calibration:
    """Every point of ``bench`` predicted and compared (errors as predicted / measured - 1)."""
    try:
        read_profile(settings.profile)  # a bad profile fails here, naming the file
    except ValueError as error:
        raise BadInputError(str(error)) from None
    prefill_s = prefill_s_per_token(settings.profile)
    k = int(bench["settings"]["k"])
    draft_s = drafting_s_per_token(bench)
    rows: list[CalibrationRow] = []
    for point in bench["points"]:
        label = f"{point['mode']} {point['rtt_ms']:g} ms x{point['sessions']}"
        if progress is not None:
            progress(label)
        scenario = point_scenario(
            point, settings, k=k, prefill_s=prefill_s, draft_s_per_token=draft_s
        )
        predicted = predict(scenario, label)
        measured_tps, measured_p50 = point["tokens_per_s"], point["latency_p50_s"]
        assert measured_tps is not None and measured_p50 is not None  # a point ran requests
        rows.append(
            {
                "mode": point["mode"],
                "rtt_ms": point["rtt_ms"],
                "sessions": point["sessions"],
                "measured_tokens_per_s": measured_tps,
                "predicted_tokens_per_s": predicted["tokens_per_s"],
                "throughput_error": predicted["tokens_per_s"] / measured_tps - 1,
                "measured_latency_p50_s": measured_p50,
                "predicted_latency_p50_s": predicted["latency_p50_s"],
                "latency_p50_error": predicted["latency_p50_s"] / measured_p50 - 1,
            }
        )
    return {
        "profile": str(settings.profile),
        "prefill_s_per_token": prefill_s,
        "draft_s_per_token": draft_s,
        "settings": {
            "window_s": settings.window_s,
            "max_batch": settings.max_batch,
            "max_tokens_per_pass": settings.max_tokens_per_pass,
            "seed": settings.seed,
        },
        "rows": rows,
        "summary": summary(rows),
    }


def summary(rows: Sequence[CalibrationRow]) -> CalibrationSummary:
    tps = [abs(r["throughput_error"]) for r in rows]
    p50 = [abs(r["latency_p50_error"]) for r in rows]
    return {
        "scenarios": len(rows),
        "max_abs_throughput_error": max(tps),
        "mean_abs_throughput_error": statistics.fmean(tps),
        "max_abs_latency_p50_error": max(p50),
        "mean_abs_latency_p50_error": statistics.fmean(p50),
        "within_throughput_target": sum(e <= THROUGHPUT_TARGET for e in tps),
        "within_latency_target": sum(e <= LATENCY_TARGET for e in p50),
    }


def markdown_table(result: Calibration) -> str:
    lines = [
        "| mode | RTT (ms) | sessions | measured tok/s | predicted tok/s | error | "
        "measured p50 (s) | predicted p50 (s) | error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['mode']} | {r['rtt_ms']:g} | {r['sessions']} | "
            f"{r['measured_tokens_per_s']:.1f} | {r['predicted_tokens_per_s']:.1f} | "
            f"{r['throughput_error']:+.1%} | {r['measured_latency_p50_s']:.2f} | "
            f"{r['predicted_latency_p50_s']:.2f} | {r['latency_p50_error']:+.1%} |"
        )
    s = result["summary"]
    lines.append("")
    lines.append(
        f"{s['scenarios']} scenarios: throughput error max {s['max_abs_throughput_error']:.1%} "
        f"(mean {s['mean_abs_throughput_error']:.1%}), within ±10 % in "
        f"{s['within_throughput_target']}; p50 latency error max "
        f"{s['max_abs_latency_p50_error']:.1%} (mean {s['mean_abs_latency_p50_error']:.1%}), "
        f"within ±15 % in {s['within_latency_target']}."
    )
    return "\n".join(lines) + "\n"


def _measured_predicted(row: CalibrationRow, key: str) -> tuple[float, float]:
    """``row``'s measured and predicted ``key`` (``tokens_per_s`` or ``latency_p50_s``)."""
    if key == "tokens_per_s":
        return row["measured_tokens_per_s"], row["predicted_tokens_per_s"]
    return row["measured_latency_p50_s"], row["predicted_latency_p50_s"]


def plot(result: Calibration, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    panels = (
        ("tokens_per_s", "output tokens/s", THROUGHPUT_TARGET),
        ("latency_p50_s", "p50 request latency (s)", LATENCY_TARGET),
    )
    for ax, (key, label, band) in zip(axes, panels, strict=True):
        for mode, marker in (("plain", "^"), ("fused", "o"), ("distributed", "s")):
            mine = [r for r in result["rows"] if r["mode"] == mode]
            ax.scatter(
                [_measured_predicted(r, key)[0] for r in mine],
                [_measured_predicted(r, key)[1] for r in mine],
                marker=marker,
                label=mode,
            )
        values = [v for r in result["rows"] for v in _measured_predicted(r, key)]
        line = np.linspace(min(values) * 0.9, max(values) * 1.1, 10)
        ax.plot(line, line, color="grey", linewidth=0.8)
        ax.fill_between(
            line,
            line * (1 - band),
            line * (1 + band),
            color="grey",
            alpha=0.15,
            label=f"±{band:.0%}",
        )
        ax.set_xlabel(f"measured {label}")
        ax.set_ylabel(f"simulated {label}")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle("Simulator against measured loopback runs")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return path


def write_calibration(result: Calibration, out: Path) -> dict[str, Path]:
    out = Path(out)
    write_json_atomic(out, result)
    table = out.with_suffix(".md")
    write_text_atomic(table, markdown_table(result))
    return {"json": out, "table": table, "plot": plot(result, out.with_suffix(".png"))}


def log_calibration(
    log_report: ReportLogger, result: Calibration, paths: dict[str, Path], bench: Path
) -> str:
    """One run holding the calibration's files, its summary as metrics; its id."""
    return log_report(
        "simulator-calibration",
        list(paths.values()),
        metrics={
            key: float(value)
            for key, value in result["summary"].items()
            if isinstance(value, int | float)  # every figure of the summary
        },
        tags={"report": "simulator-calibration", "bench": str(bench)},
    )
