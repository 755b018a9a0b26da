"""The load test's results, typed: one concurrency level's summary, the table's rows and
the results file ``specops loadtest`` writes."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from tasks.json_types import JsonObject


class LatencySpread(TypedDict):
    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None


class TtftSpread(TypedDict):
    p50: float | None
    p99: float | None


class ServerRss(TypedDict):
    """The server's resident memory, sampled while the level ran."""

    peak: float | None  # MB
    samples: int


class LevelSummary(TypedDict):
    """One concurrency level's figures (:func:`summarize_level`); the comparison with the
    reference level and the speedup are added by :func:`sweep_results`."""

    clients: int
    requests: int
    succeeded: int
    errors: int
    errors_by_kind: dict[str | None, int]
    wall_s: float
    requests_per_s: float | None
    completion_tokens: int
    tokens_per_s: float | None
    latency_s: LatencySpread
    ttft_s: TtftSpread
    acceptance_rate: float | None
    mean_accepted_length: float | None
    server_rss_mb: ServerRss
    compared_prompts: NotRequired[int]
    outputs_equal: NotRequired[bool | None]
    mismatched_prompts: NotRequired[list[int] | None]
    speedup_vs_one_client: NotRequired[float | None]


class LoadTableRow(TypedDict):
    """One level's row of the table."""

    clients: int
    tokens_per_s: float | None
    speedup_vs_one_client: float | None
    requests_per_s: float | None
    latency_p50_s: float | None
    latency_p90_s: float | None
    ttft_p50_s: float | None
    peak_rss_mb: float | None
    errors: int
    outputs_equal: bool | None
    mismatched_prompts: list[int] | None


class Warmup(TypedDict):
    ok: bool
    latency_s: float
    error: str | None


class LoadSweepResults(TypedDict):
    """The results file of ``specops loadtest`` (``serve_args``: added by the command)."""

    settings: JsonObject  # the LoadTestSettings' fields but prompts and clients
    clients_levels: list[int]
    baseline_clients: int
    warmup: Warmup
    outputs_equal: bool | None
    levels: list[LevelSummary]
    table: list[LoadTableRow]
    serve_args: NotRequired[str | None]


class LoadTestResults(LevelSummary):
    """One level's summary with the settings and the warm-up beside it."""

    settings: JsonObject
    warmup: Warmup
