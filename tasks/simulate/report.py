"""The figures of a simulation run, drawn from its event log, as one plain dict.

- ``throughput_tokens_per_s``: output tokens that reached clients during the arrival
  window ``[0, duration_s]``, divided by ``duration_s``;
- ``ttft_s``: arrival to the first round's tokens at the client (prefill and queueing
  included); ``tpot_s``: ``(finish - first token) / (output_tokens - 1)`` per request with
  more than one output token; ``latency_s``: arrival to finish. Each as mean, p50, p90,
  p99 over the requests that got that far (``None`` when none did);
- ``goodput_requests_per_s``: requests finishing with ``latency <= slo_s``, over
  ``duration_s``;
- per server: ``queue_depth`` (blocks left waiting when a pass starts, averaged per
  ``queue_bin_s`` bin of simulated time; ``None`` in a bin without a pass),
  ``rows_utilisation`` (mean decode rows per decode pass / ``max_tokens_per_pass``),
  ``batch_utilisation`` (mean requests per decode pass / ``max_batch``), ``busy`` (share of
  the run spent in passes);
- pooled over the servers: ``batch_utilisation`` (requests in all decode passes over the
  sum of those passes' ``max_batch``), ``rows_utilisation`` (likewise with rows and
  ``max_tokens_per_pass``), ``busy`` (time in passes over ``servers * end_s``).
"""

from __future__ import annotations

from pathlib import Path
from typing import NotRequired, Protocol, TypedDict

import numpy as np

from serving.atomic import write_json_atomic
from tasks.simulate.model import SimLog


class Spread(TypedDict):
    """Mean and percentiles of one figure over the requests (``None``: no request got
    that far)."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None


class Pooled(TypedDict):
    """Utilisation pooled over the servers (see the module docstring)."""

    batch_utilisation: float
    rows_utilisation: float
    busy: float


class ServerFigures(TypedDict):
    """One server's section of the report."""

    passes: int
    busy: float
    rows_utilisation: float
    batch_utilisation: float
    queue_bin_s: float
    queue_depth: list[float | None]  # per bin of simulated time


class SimReport(Pooled):
    """A run's figures, as ``specops simulate`` writes them (``wall_s``: added by the
    command; ``servers``: left out of a sweep's points)."""

    duration_s: float
    end_s: float
    requests: int
    finished: int
    unfinished: int
    throughput_tokens_per_s: float
    goodput_requests_per_s: float
    slo_s: float
    ttft_s: Spread
    tpot_s: Spread
    latency_s: Spread
    queue_wait_s: Spread
    servers: NotRequired[dict[str, ServerFigures]]
    wall_s: NotRequired[float]


def _spread(values: np.ndarray) -> Spread:
    if values.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99]).tolist()
    return {"mean": float(values.mean()), "p50": p50, "p90": p90, "p99": p99}


def summarise(log: SimLog, *, per_server: bool = True) -> SimReport:
    """The run's figures (see the module docstring for each formula); ``per_server=False``
    leaves out the per-server section (queue depth over time), as a sweep does."""
    requests = log.requests
    arrival = np.fromiter((r.arrival_s for r in requests), float, len(requests))
    first = np.fromiter((r.first_token_s for r in requests), float, len(requests))
    finish = np.fromiter((r.finish_s for r in requests), float, len(requests))
    output = np.fromiter((r.output_tokens for r in requests), int, len(requests))
    wait = np.fromiter((r.queue_wait_s for r in requests), float, len(requests))
    finished = ~np.isnan(finish)
    started = ~np.isnan(first)
    latency = finish[finished] - arrival[finished]
    several = finished & (output > 1)
    tpot = (finish[several] - first[several]) / (output[several] - 1)
    passes = _Passes(log)
    report: SimReport = {
        "duration_s": log.duration_s,
        "end_s": log.end_s,
        "requests": len(requests),
        "finished": int(finished.sum()),
        "unfinished": int((~finished).sum()),
        "throughput_tokens_per_s": log.tokens_in_window / log.duration_s,
        "goodput_requests_per_s": float((latency <= log.slo_s).sum()) / log.duration_s,
        "slo_s": log.slo_s,
        "ttft_s": _spread(first[started] - arrival[started]),
        "tpot_s": _spread(tpot),
        "latency_s": _spread(latency),
        "queue_wait_s": _spread(wait[finished]),
        **passes.pooled(),
    }
    if per_server:
        report["servers"] = passes.per_server()
    return report


class _Passes:
    """The pass log as arrays, with every per-server sum taken in one ``bincount``."""

    def __init__(self, log: SimLog) -> None:
        self.log = log
        passes, count = log.passes, len(log.servers)
        self.server = np.array(passes.server, dtype=int)
        self.duration = np.array(passes.duration_s, dtype=float)
        self.rows = np.array(passes.rows, dtype=float)
        self.members = np.array(passes.requests, dtype=float)
        decode = self.rows > 0
        self.decode = decode
        self.max_batch = np.array([s.max_batch for s in log.servers], dtype=float)
        self.max_rows = np.array([s.max_tokens_per_pass for s in log.servers], dtype=float)
        self.passes = np.bincount(self.server, minlength=count)
        self.busy_s = np.bincount(self.server, weights=self.duration, minlength=count)
        self.decodes = np.bincount(self.server[decode], minlength=count)
        self.decode_rows = np.bincount(
            self.server[decode], weights=self.rows[decode], minlength=count
        )
        self.decode_members = np.bincount(
            self.server[decode], weights=self.members[decode], minlength=count
        )

    def pooled(self) -> Pooled:
        log, decodes = self.log, self.decodes
        batch_slots = float((decodes * self.max_batch).sum())
        row_slots = float((decodes * self.max_rows).sum())
        capacity = len(log.servers) * log.end_s
        return {
            "batch_utilisation": float(self.decode_members.sum()) / batch_slots
            if batch_slots
            else 0.0,
            "rows_utilisation": float(self.decode_rows.sum()) / row_slots if row_slots else 0.0,
            "busy": float(self.busy_s.sum()) / capacity if capacity > 0 else 0.0,
        }

    def per_server(self) -> dict[str, ServerFigures]:
        log = self.log
        count = len(log.servers)
        bins = max(1, int(np.ceil(log.end_s / log.queue_bin_s)))
        start = np.array(log.passes.start_s, dtype=float)
        queued = np.array(log.passes.queued, dtype=float)
        slot = np.minimum((start / log.queue_bin_s).astype(int), bins - 1)
        cell = self.server * bins + slot
        samples = np.bincount(cell, minlength=count * bins).reshape(count, bins)
        depth = np.bincount(cell, weights=queued, minlength=count * bins).reshape(count, bins)
        out: dict[str, ServerFigures] = {}
        for index, info in enumerate(log.servers):
            decodes = int(self.decodes[index])
            out[info.name] = {
                "passes": int(self.passes[index]),
                "busy": float(self.busy_s[index] / log.end_s) if log.end_s > 0 else 0.0,
                "rows_utilisation": (
                    float(self.decode_rows[index] / decodes / info.max_tokens_per_pass)
                    if decodes
                    else 0.0
                ),
                "batch_utilisation": (
                    float(self.decode_members[index] / decodes / info.max_batch) if decodes else 0.0
                ),
                "queue_bin_s": log.queue_bin_s,
                "queue_depth": [
                    float(d / n) if n else None
                    for d, n in zip(depth[index].tolist(), samples[index].tolist(), strict=True)
                ],
            }
        return out


def write_report(report: SimReport, path: str | Path) -> None:
    """Write ``report`` as JSON, atomically."""
    write_json_atomic(path, report)


def plot_report(report: SimReport, path: str | Path) -> Path:
    """One scenario's report as a figure (PNG, atomic): every server's queue depth over
    time, its busy share and batch utilisation, and the latency percentiles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from serving.atomic import atomic_path

    servers = report.get("servers") or {}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for name, server in servers.items():
        depth = server["queue_depth"]
        times = [i * server["queue_bin_s"] for i in range(len(depth))]
        axes[0].plot(times, [np.nan if d is None else d for d in depth], label=name)
    axes[0].set_xlabel("simulated time (s)")
    axes[0].set_ylabel("blocks waiting at a pass start")
    axes[0].set_title("Queue depth over time")
    if 0 < len(servers) <= 12:
        axes[0].legend(fontsize=7)
    names = list(servers)
    x = np.arange(len(names))
    axes[1].bar(x - 0.2, [servers[n]["busy"] for n in names], 0.4, label="busy")
    axes[1].bar(
        x + 0.2, [servers[n]["batch_utilisation"] for n in names], 0.4, label="batch utilisation"
    )
    axes[1].set_xticks(x, names, rotation=45, ha="right", fontsize=7)
    axes[1].set_ylim(0, 1.05)
    axes[1].set_title("Servers")
    axes[1].legend(fontsize=7)
    quantiles = ("p50", "p90", "p99")
    spreads: tuple[tuple[str, Spread | None], ...] = (
        ("ttft_s", report.get("ttft_s")),
        ("latency_s", report.get("latency_s")),
        ("queue_wait_s", report.get("queue_wait_s")),
    )
    for offset, (key, spread) in zip((-0.25, 0.0, 0.25), spreads, strict=True):
        figures = (spread["p50"], spread["p90"], spread["p99"]) if spread else (None,) * 3
        values = [v or 0.0 for v in figures]
        axes[2].bar(np.arange(len(quantiles)) + offset, values, 0.25, label=key)
    axes[2].set_xticks(np.arange(len(quantiles)), quantiles)
    axes[2].set_ylabel("seconds")
    axes[2].set_title(
        f"{report['throughput_tokens_per_s']:.1f} tokens/s, "
        f"goodput {report['goodput_requests_per_s']:.2f} req/s"
    )
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return out


class ReportLogger(Protocol):
    """``registry.client.Registry.log_report``: one MLflow run with files and metrics."""

    def __call__(
        self,
        name: str,
        files: list[Path],
        *,
        metrics: dict[str, float] | None = None,
        tags: dict[str, str] | None = None,
    ) -> str: ...


def headline(report: SimReport) -> dict[str, float]:
    """The report's own numbers (not its per-server or time-series sections), as metrics."""
    return {
        key: float(value)
        for key, value in report.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


def log_scenario(
    log_report: ReportLogger, report: SimReport, files: list[Path], config: Path
) -> str:
    """One run holding a scenario's report files and its headline numbers; its id."""
    return log_report(
        f"simulate-{config.stem}",
        files,
        metrics=headline(report),
        tags={"report": "simulate", "config": str(config)},
    )
