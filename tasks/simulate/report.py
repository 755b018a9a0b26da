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
  the run spent in passes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from serving.atomic import write_json_atomic
from tasks.simulate.model import SimLog


def _spread(values: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99]).tolist()
    return {"mean": float(values.mean()), "p50": p50, "p90": p90, "p99": p99}


def summarise(log: SimLog) -> dict[str, Any]:
    """The run's figures (see the module docstring for each formula)."""
    requests = log.requests
    arrival = np.array([r.arrival_s for r in requests], dtype=float)
    first = np.array([r.first_token_s for r in requests], dtype=float)
    finish = np.array([r.finish_s for r in requests], dtype=float)
    output = np.array([r.output_tokens for r in requests], dtype=int)
    wait = np.array([r.queue_wait_s for r in requests], dtype=float)
    finished = ~np.isnan(finish)
    started = ~np.isnan(first)
    latency = finish[finished] - arrival[finished]
    several = finished & (output > 1)
    tpot = (finish[several] - first[several]) / (output[several] - 1)
    return {
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
        "servers": _servers(log),
    }


def _servers(log: SimLog) -> dict[str, dict[str, Any]]:
    passes = log.passes
    server = np.array(passes.server, dtype=int)
    start = np.array(passes.start_s, dtype=float)
    duration = np.array(passes.duration_s, dtype=float)
    rows = np.array(passes.rows, dtype=float)
    members = np.array(passes.requests, dtype=float)
    queued = np.array(passes.queued, dtype=float)
    bins = max(1, int(np.ceil(log.end_s / log.queue_bin_s)))
    out: dict[str, dict[str, Any]] = {}
    for index, info in enumerate(log.servers):
        mine = server == index
        decode = mine & (rows > 0)
        slot = np.minimum((start[mine] / log.queue_bin_s).astype(int), bins - 1)
        samples = np.bincount(slot, minlength=bins)
        depth = np.bincount(slot, weights=queued[mine], minlength=bins)
        out[info.name] = {
            "passes": int(mine.sum()),
            "busy": float(duration[mine].sum() / log.end_s) if log.end_s > 0 else 0.0,
            "rows_utilisation": (
                float(rows[decode].mean() / info.max_tokens_per_pass) if decode.any() else 0.0
            ),
            "batch_utilisation": (
                float(members[decode].mean() / info.max_batch) if decode.any() else 0.0
            ),
            "queue_bin_s": log.queue_bin_s,
            "queue_depth": [
                float(d / n) if n else None for d, n in zip(depth, samples, strict=True)
            ],
        }
    return out


def write_report(report: dict[str, Any], path: str | Path) -> None:
    """Write ``report`` as JSON, atomically."""
    write_json_atomic(path, report)
