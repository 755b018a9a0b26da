"""The server's Prometheus metrics, named after vLLM's (``vllm:`` -> ``specops:``).

Counts come from :mod:`serving.engine.metrics` (the one definition of draft/accepted tokens and
acceptance by position), so ``/metrics``, the CLI, MLflow and the gates agree:

- acceptance rate = ``spec_decode_num_accepted_tokens_total / spec_decode_num_draft_tokens_total``
- mean accepted length = ``generation_tokens_total / spec_decode_num_checks_total``
- acceptance at position i = ``spec_decode_num_accepted_tokens_per_pos{position=i}``
  / ``spec_decode_num_drafts_per_pos{position=i}``
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from serving.engine.metrics import StepRecord, position_counts
from serving.hardware import HardwareTarget
from serving.records.schema import LIVE_WORKLOAD

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300)
TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32)
PASS_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256)


class ServerMetrics:
    def __init__(self, *, model_name: str, hardware: HardwareTarget) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, cpu seconds
        self._labels = {"model_name": model_name, "hardware": hardware.name}
        # Registered in this order, which is the order /metrics lists them in.
        self._request_counters()
        self._spec_decode_counters()
        self._traffic_counters()
        self._histograms()
        self._gauges()

    def _counter(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
        return Counter(f"specops:{name}", doc, [*self._labels, *extra], registry=self.registry)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(
            f"specops:{name}", doc, [*self._labels], buckets=buckets, registry=self.registry
        )

    def _gauge(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
        return Gauge(f"specops:{name}", doc, [*self._labels, *extra], registry=self.registry)

    def _request_counters(self) -> None:
        counter = self._counter
        self.requests = counter(
            "request_success", "Requests finished, by finish reason.", ("finished_reason",)
        )
        self.errors = counter(
            "request_errors", "Requests refused or failed, by HTTP status.", ("status",)
        )
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")

    def _spec_decode_counters(self) -> None:
        counter = self._counter
        self.checks = counter(
            "spec_decode_num_checks", "Target verification passes (one per decode step)."
        )
        self.drafts = counter("spec_decode_num_drafts", "Decode steps that proposed drafts.")
        self.draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens proposed.")
        self.accepted_tokens = counter(
            "spec_decode_num_accepted_tokens", "Draft tokens the target accepted."
        )
        self.drafts_per_pos = counter(
            "spec_decode_num_drafts_per_pos",
            "Steps that proposed a draft at this position (0-based).",
            ("position",),
        )
        self.accepted_per_pos = counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted at this position (0-based).",
            ("position",),
        )

    def _traffic_counters(self) -> None:
        """Capture, refusals before parsing, and draft swaps."""
        counter = self._counter
        self.captured = counter("captured_requests", "Requests captured into the store.")
        self.capture_opt_outs = counter(
            "capture_opt_outs", "Requests whose client opted out of capture (never captured)."
        )
        self.redactions = counter(
            "capture_redactions", "Secrets redacted from captured records, by kind.", ("kind",)
        )
        self.capture_dropped = counter(
            "capture_dropped", "Captured records dropped, not written, by reason.", ("reason",)
        )
        self.rejected = counter(
            "requests_rejected",
            "Requests refused before parsing (401 no/bad API key, 413 body size, "
            "429 rate_limit/queue_full), by reason.",
            ("reason",),
        )
        self.swaps = counter("draft_swaps", "Hot swaps to a newly promoted draft.")

    def _histograms(self) -> None:
        histogram = self._histogram
        self.e2e = histogram(
            "e2e_request_latency_seconds", "Request latency, queue included.", LATENCY_BUCKETS
        )
        self.queue_time = histogram(
            "request_queue_time_seconds", "Time spent waiting in the queue.", LATENCY_BUCKETS
        )
        self.ttft = histogram(
            "time_to_first_token_seconds",
            "Time to the first token, queue included.",
            LATENCY_BUCKETS,
        )
        self.tpot = histogram(
            "time_per_output_token_seconds",
            "Mean time per output token after the first.",
            TOKEN_BUCKETS,
        )
        self.batch_size = histogram(
            "batch_size", "Requests in one packed target pass.", BATCH_BUCKETS
        )
        self.tokens_per_pass = histogram(
            "batch_tokens_per_pass",
            "Tokens in one packed target pass (pending tokens and drafts of all requests).",
            PASS_TOKEN_BUCKETS,
        )

    def _gauges(self) -> None:
        gauge = self._gauge
        self.running = gauge("num_requests_running", "Requests being decoded.")
        self.waiting = gauge("num_requests_waiting", "Requests in the queue.")
        self.draft_info = gauge(
            "draft_info", "1 for the draft serving now.", ("version", "drafter")
        )
        self.evaluated_acceptance = gauge(
            "champion_evaluated_acceptance_rate",
            "The acceptance rate the serving champion's evaluation measured on this target "
            "(on held-out traffic of this workload where it had some): what the live "
            "acceptance (spec_decode_num_accepted_tokens / spec_decode_num_draft_tokens) "
            "is held against.",
            ("version", "workload"),
        )

    def labels(self, metric, **extra: str):
        return metric.labels(**self._labels, **extra)

    def error(self, status: int) -> None:
        self.labels(self.errors, status=str(status)).inc()

    def finished(
        self,
        *,
        finished_reason: str,
        prompt_tokens: int,
        steps: list[StepRecord],
        generated: int,
        e2e_s: float,
        queue_s: float,
        ttft_s: float | None,
    ) -> None:
        self.labels(self.requests, finished_reason=finished_reason).inc()
        self.labels(self.prompt_tokens).inc(prompt_tokens)
        self.labels(self.generation_tokens).inc(generated)
        self.labels(self.checks).inc(len(steps))
        self.labels(self.drafts).inc(sum(1 for s in steps if s.proposed))
        self.labels(self.draft_tokens).inc(sum(s.proposed for s in steps))
        self.labels(self.accepted_tokens).inc(sum(s.accepted for s in steps))
        reached, kept = position_counts(steps)
        for position, (r, k) in enumerate(zip(reached, kept, strict=True)):
            self.labels(self.drafts_per_pos, position=str(position)).inc(r)
            self.labels(self.accepted_per_pos, position=str(position)).inc(k)
        self.labels(self.e2e).observe(e2e_s)
        self.labels(self.queue_time).observe(queue_s)
        if ttft_s is not None:
            self.labels(self.ttft).observe(ttft_s)
            if generated > 1:
                self.labels(self.tpot).observe((e2e_s - ttft_s) / (generated - 1))

    def redacted(self, counts: Mapping[str, int]) -> None:
        for kind, n in counts.items():
            self.labels(self.redactions, kind=kind).inc(n)

    def observe_pass(self, *, size: int, tokens: int) -> None:
        """One packed target pass of ``size`` requests and ``tokens`` tokens."""
        self.labels(self.batch_size).observe(size)
        self.labels(self.tokens_per_pass).observe(tokens)

    def set_queue(self, *, running: int, waiting: int) -> None:
        self.labels(self.running).set(running)
        self.labels(self.waiting).set(waiting)

    def set_draft(
        self, version: str, drafter: str, evaluated_acceptance: float | None = None
    ) -> None:
        """The draft serving now, and what its evaluation accepted on live traffic (the
        gauge is absent when nothing says: a static drafter, a champion never evaluated)."""
        self.draft_info.clear()
        self.labels(self.draft_info, version=version, drafter=drafter).set(1)
        self.evaluated_acceptance.clear()
        if evaluated_acceptance is not None:
            self.labels(self.evaluated_acceptance, version=version, workload=LIVE_WORKLOAD).set(
                evaluated_acceptance
            )

    def render(self) -> bytes:
        return generate_latest(self.registry)
