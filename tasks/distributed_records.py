"""The results of ``specops distributed bench`` as JSON: what :mod:`tasks.bench.distributed`
writes and :mod:`tasks.simulate.calibrate` (the simulator's calibration) reads back.

The two packages sit side by side in the tasks' layers, so the shapes they share live here,
below both. Each is a plain dict at run time (``TypedDict``): the JSON is unchanged.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from tasks.json_types import JsonObject


class RequestRecord(TypedDict):
    """One request of a bench point. ``prompt_tokens`` is missing from results written
    before the bench recorded it (:mod:`tasks.simulate.prompt_lengths` fills it in)."""

    prompt: int  # the request's index in the bench's workload
    prompt_tokens: NotRequired[int]
    output_tokens: int
    latency_s: float
    ttft_s: float
    draft_s: NotRequired[float]  # the client's drafting time (distributed mode)
    steps: list[tuple[int, int]]  # (proposed, accepted) per verification step


class BenchPoint(TypedDict):
    """One (mode, injected RTT, concurrent sessions) point of the grid."""

    mode: str  # "plain", "distributed" or "fused"
    rtt_ms: float
    sessions: int
    requests: int
    wall_s: float
    output_tokens: int
    tokens_per_s: float | None
    latency_p50_s: float | None
    latency_p90_s: float | None
    ttft_p50_s: float | None
    steps: int
    tokens_per_step: float | None
    acceptance_rate: float | None
    round_trips_per_request: float
    mean_pass_sessions: float | None
    equal_to_plain: int | None  # requests whose output equals plain decoding's
    per_request: list[RequestRecord]


class ComparisonRow(TypedDict):
    """One (RTT, sessions) row of the table: both modes side by side, plain beside them."""

    rtt_ms: float
    sessions: int
    distributed_tokens_per_s: float | None
    fused_tokens_per_s: float | None
    distributed_over_fused: float
    plain_tokens_per_s: float | None
    distributed_latency_p50_s: float | None
    fused_latency_p50_s: float | None
    equal_to_plain: bool
    better: str  # "distributed" or "fused"


class DistributedBenchResults(TypedDict):
    """The whole results file. ``settings``: the bench's settings (the dataclass's fields,
    ``max_sessions``, and what the command line adds: threads, hardware)."""

    settings: JsonObject
    points: list[BenchPoint]
    table: list[ComparisonRow]
    all_equal_to_plain: bool
    crossover_rtt_ms: NotRequired[dict[int, float | None]]
