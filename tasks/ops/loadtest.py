"""A load test of a specops server on loopback, through the official ``openai`` client.

One run measures several concurrency levels against the same server, one after the other
(:func:`run_load_sweep`; :func:`run_load_test` is the one-level case). Before the first level
one request is sent and not measured: it pays the server's lazy initialisation. At each
level N concurrent clients send ``requests`` chat requests (the same prompts in the same
order at every level: a workload's held-out split), each streamed so that time to first
token is measured and the completion text is kept.

Per level: throughput (completion tokens/s and successful requests/s over the level's wall
time), latency p50/p90/p99 and mean, TTFT p50/p99, errors by kind, pooled acceptance from
the responses' ``usage``, and the server's peak resident memory during the level (sampled
from its ``/metrics``). Across levels: each level's tokens/s over the lowest level's
(``speedup_vs_one_client``; the lowest level is 1 client unless told otherwise) and, at
temperature 0, whether every prompt's completion equals the lowest level's (the server
batches requests; greedy output must not depend on what else is in the batch). Bounded in
count and in time: every request has a timeout and each level stops after ``requests``.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from serving.defaults import DEFAULT_TARGET
from serving.errors import BadInputError
from serving.security.tls import ca_context
from tasks.ops.loadtest_report import markdown_table, plot, table_rows, write_report
from tasks.ops.loadtest_types import (
    LevelSummary,
    LoadSweepResults,
    LoadTestResults,
)

RSS_PATTERN = re.compile(r"^process_resident_memory_bytes\s+([0-9.e+]+)", re.MULTILINE)
DEFAULT_LEVELS = (1, 2, 4, 8)
_POSITIVE = re.compile(r"[0-9]+")

# Re-exported: ``specops loadtest`` and the tests import the report from here.
__all__ = [
    "DEFAULT_LEVELS",
    "LoadTestSettings",
    "check_levels",
    "compare_outputs",
    "markdown_table",
    "parse_levels",
    "plot",
    "run_load_sweep",
    "run_load_test",
    "sweep_results",
    "write_report",
]


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadInputError(f"{name} must be an integer >= 1, got {value!r}")


@dataclass
class LoadTestSettings:
    url: str = "http://127.0.0.1:8000"
    model: str = DEFAULT_TARGET
    clients: int = 4  # the level of run_load_test; run_load_sweep takes its levels apart
    requests: int = 16  # per level
    max_tokens: int = 64
    temperature: float = 0.0
    workload: str = "sharegpt"
    seed: int = 0
    timeout_s: float = 300.0
    drafter: str | None = None  # None: the server's champion
    skeleton: bool = False  # send `skeleton: true` (skeleton-of-thought decoding) per request
    prompts: list[str] = field(default_factory=list)  # empty: the workload's held-out prompts
    tls_ca: Path | None = None  # an https url's server is verified with this CA file

    def verify(self) -> ssl.SSLContext | None:
        """What the clients verify an https server with (None: plain HTTP)."""
        return ca_context(self.tls_ca) if self.url.startswith("https://") else None

    def check(self) -> None:
        for name in ("clients", "requests", "max_tokens"):
            _check_positive(name, getattr(self, name))
        if self.temperature < 0:
            raise BadInputError(f"temperature must be >= 0, got {self.temperature!r}")
        loopback = ("127.", "localhost", "[::1]")
        if not self.url.startswith(
            tuple(f"{s}://{h}" for s in ("http", "https") for h in loopback)
        ):
            raise BadInputError(
                f"the load test only targets loopback addresses, got url={self.url!r}"
            )
        if self.tls_ca is not None and not self.url.startswith("https://"):
            raise BadInputError(f"a CA file (tls_ca) is for an https server, got url={self.url!r}")
        self.verify()  # a bad CA file fails here


def parse_levels(text: str) -> list[int]:
    """``"1,2,4,8"`` -> ``[1, 2, 4, 8]``: positive integers, sorted, each once."""
    items = [item.strip() for item in text.split(",")]
    for item in items:
        if not _POSITIVE.fullmatch(item) or int(item) < 1:
            raise BadInputError(
                f"clients must be positive integers, got {item!r}; give a comma list "
                f"such as {','.join(map(str, DEFAULT_LEVELS))}"
            )
    return sorted({int(item) for item in items})


def check_levels(levels: Sequence[int], requests: int) -> list[int]:
    """The levels sorted, each once; refused when one is not a positive integer or
    exceeds ``requests`` (that level would never have that many requests in flight)."""
    if not levels:
        raise BadInputError("the load test needs at least one clients level, e.g. 1,2,4,8")
    for level in levels:
        _check_positive("clients", level)
    ordered = sorted(set(levels))
    if ordered[-1] > requests:
        raise BadInputError(
            f"requests ({requests}) is below the largest clients level ({ordered[-1]}): "
            f"that level would never have {ordered[-1]} requests in flight; raise requests "
            f"to at least {ordered[-1]}"
        )
    return ordered


@dataclass
class _Sample:
    ok: bool
    latency_s: float
    ttft_s: float | None = None
    completion_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    checks: int = 0
    error: str | None = None
    index: int = 0  # the request's position in its level
    prompt_index: int = 0  # into the prompt list; index % len(prompts)
    text: str = ""  # the stream's content deltas, concatenated


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def load_prompts(settings: LoadTestSettings) -> list[str]:
    if settings.prompts:
        return list(settings.prompts)
    from tasks.data.traffic import build_workload

    count = min(settings.requests, 64)
    return [p.user_text for p in build_workload(settings.workload, count, seed=settings.seed)]


async def _one(client, settings: LoadTestSettings, prompt: str) -> _Sample:
    from openai import APIError

    started = time.perf_counter()
    extra: dict[str, str | bool] = {}
    if settings.drafter:
        extra["drafter"] = settings.drafter
    if settings.skeleton:
        extra["skeleton"] = True
    ttft = None
    pieces: list[str] = []
    try:
        stream = await client.chat.completions.create(
            model=settings.model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=settings.max_tokens,
            temperature=settings.temperature,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra or None,
        )
        usage = None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if ttft is None:
                    ttft = time.perf_counter() - started
                pieces.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                usage = chunk.usage
    except (APIError, OSError, TimeoutError) as error:
        return _Sample(
            ok=False,
            latency_s=time.perf_counter() - started,
            error=type(error).__name__,
        )
    if usage is None:
        return _Sample(False, time.perf_counter() - started, error="no usage in the stream")
    speculative = (usage.model_extra or {}).get("speculative") or {}
    return _Sample(
        ok=True,
        latency_s=time.perf_counter() - started,
        ttft_s=ttft,
        completion_tokens=usage.completion_tokens,
        draft_tokens=int(speculative.get("draft_tokens", 0)),
        accepted_tokens=int(speculative.get("accepted_tokens", 0)),
        checks=int(speculative.get("checks", 0)),
        text="".join(pieces),
    )


async def _sample_memory(
    settings: LoadTestSettings, stop: asyncio.Event, peaks: list[float]
) -> None:
    import httpx

    from serving.security.keys import client_key

    url = settings.url
    verify = settings.verify() or True
    headers = {"Authorization": f"Bearer {client_key()}"}  # /metrics needs the key too
    async with httpx.AsyncClient(timeout=5.0, verify=verify, headers=headers) as http:
        while not stop.is_set():
            try:
                text = (await http.get(f"{url}/metrics")).text
                match = RSS_PATTERN.search(text)
                if match:
                    peaks.append(float(match.group(1)))
            except httpx.HTTPError:
                pass
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.5)
            except TimeoutError:
                continue


async def _measure_level(
    client, settings: LoadTestSettings, prompts: list[str], clients: int, *, progress: bool
) -> tuple[list[_Sample], float, list[float]]:
    """``settings.requests`` requests from ``clients`` concurrent clients: the samples (in
    completion order), the wall time and the server's RSS readings during the level."""
    from tqdm.auto import tqdm

    samples: list[_Sample] = []
    bar = tqdm(total=settings.requests, desc=f"{clients} clients", unit="req", disable=not progress)
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < settings.requests:
            index = next_index
            next_index += 1
            prompt_index = index % len(prompts)
            sample = await _one(client, settings, prompts[prompt_index])
            sample.index, sample.prompt_index = index, prompt_index
            samples.append(sample)
            bar.update()

    stop = asyncio.Event()
    memory: list[float] = []
    sampler = asyncio.create_task(_sample_memory(settings, stop, memory))
    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(clients)))
    finally:
        wall = time.perf_counter() - started
        stop.set()
        await sampler
        bar.close()
    return samples, wall, memory


async def run_load_sweep(
    settings: LoadTestSettings, levels: Sequence[int], *, progress: bool = True
) -> LoadSweepResults:
    """Measure each concurrency level in ``levels`` (ascending) against one server, after one
    unmeasured warm-up request; the results of :func:`sweep_results`."""
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    from serving.security.keys import client_key

    settings.check()
    ordered = check_levels(levels, settings.requests)
    prompts = load_prompts(settings)
    if not prompts:
        raise BadInputError("the load test has no prompts")
    verify = settings.verify()
    client = AsyncOpenAI(
        base_url=f"{settings.url}/v1",
        api_key=client_key(),  # $SPECOPS_API_KEYS' first, as the server it started reads
        max_retries=0,  # a 429 is a result here, not something to hide
        timeout=settings.timeout_s,
        http_client=DefaultAsyncHttpxClient(verify=verify) if verify else None,
    )
    measured: dict[int, tuple[list[_Sample], float, list[float]]] = {}
    try:
        warmup = await _one(client, settings, prompts[0])
        for clients in ordered:
            measured[clients] = await _measure_level(
                client, settings, prompts, clients, progress=progress
            )
    finally:
        await client.close()
    return sweep_results(settings, measured, warmup)


async def run_load_test(settings: LoadTestSettings, *, progress: bool = True) -> LoadTestResults:
    """One level, ``settings.clients`` concurrent clients: that level's summary (see
    :func:`summarize_level`) with ``settings`` and ``warmup`` beside it."""
    results = await run_load_sweep(settings, [settings.clients], progress=progress)
    return {"settings": results["settings"], "warmup": results["warmup"], **results["levels"][0]}


def summarize_level(
    clients: int, samples: list[_Sample], wall_s: float, memory: list[float]
) -> LevelSummary:
    """One level's figures. Throughput counts successful requests only."""
    ok = [s for s in samples if s.ok]
    latencies = [s.latency_s for s in ok]
    ttfts = [s.ttft_s for s in ok if s.ttft_s is not None]
    tokens = sum(s.completion_tokens for s in ok)
    drafted = sum(s.draft_tokens for s in ok)
    accepted = sum(s.accepted_tokens for s in ok)
    checks = sum(s.checks for s in ok)
    return {
        "clients": clients,
        "requests": len(samples),
        "succeeded": len(ok),
        "errors": len(samples) - len(ok),
        "errors_by_kind": dict(Counter(s.error for s in samples if not s.ok)),
        "wall_s": wall_s,
        "requests_per_s": len(ok) / wall_s if wall_s else None,
        "completion_tokens": tokens,
        "tokens_per_s": tokens / wall_s if wall_s else None,
        "latency_s": {
            "p50": percentile(latencies, 50),
            "p90": percentile(latencies, 90),
            "p99": percentile(latencies, 99),
            "mean": statistics.fmean(latencies) if latencies else None,
        },
        "ttft_s": {"p50": percentile(ttfts, 50), "p99": percentile(ttfts, 99)},
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_length": tokens / checks if checks else None,
        "server_rss_mb": {
            "peak": max(memory) / 2**20 if memory else None,
            "samples": len(memory),
        },
    }


def texts_by_prompt(samples: list[_Sample]) -> dict[int, list[str]]:
    """Prompt index -> the completion texts of its successful requests, in request order."""
    texts: dict[int, list[str]] = {}
    for sample in sorted(samples, key=lambda s: s.index):
        if sample.ok:
            texts.setdefault(sample.prompt_index, []).append(sample.text)
    return texts


def compare_outputs(reference: list[_Sample], samples: list[_Sample]) -> tuple[int, list[int]]:
    """How many prompts were compared, and the indexes of those where some successful
    request's text differs from the reference level's first successful text for that
    prompt. Failed requests, and prompts the reference never completed, are not compared."""
    expected = {index: texts[0] for index, texts in texts_by_prompt(reference).items()}
    compared = {i: texts for i, texts in texts_by_prompt(samples).items() if i in expected}
    mismatched = [i for i, texts in compared.items() if any(t != expected[i] for t in texts)]
    return len(compared), sorted(mismatched)


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def sweep_results(
    settings: LoadTestSettings,
    measured: dict[int, tuple[list[_Sample], float, list[float]]],
    warmup: _Sample,
) -> LoadSweepResults:
    """The results file's content: the settings, the warm-up, one summary per level (with
    ``speedup_vs_one_client``, ``outputs_equal`` and ``mismatched_prompts``), ``table``.

    The reference is the lowest level. Outputs are compared only at temperature 0; above
    it, or where no prompt could be compared (every request failed), ``outputs_equal`` is
    None."""
    base_clients = min(measured)
    base_samples = measured[base_clients][0]
    greedy = settings.temperature == 0
    levels: list[LevelSummary] = []
    for clients in sorted(measured):
        samples, wall_s, memory = measured[clients]
        level = summarize_level(clients, samples, wall_s, memory)
        compared, mismatched = compare_outputs(base_samples, samples) if greedy else (0, [])
        level["compared_prompts"] = compared
        level["outputs_equal"] = not mismatched if compared else None
        level["mismatched_prompts"] = mismatched if compared else None
        levels.append(level)
    base_rate = levels[0]["tokens_per_s"]
    for level in levels:
        level["speedup_vs_one_client"] = _ratio(level["tokens_per_s"], base_rate)
    equal = [level["outputs_equal"] for level in levels if level["outputs_equal"] is not None]
    return {
        "settings": {k: v for k, v in asdict(settings).items() if k not in ("prompts", "clients")},
        "clients_levels": sorted(measured),
        "baseline_clients": base_clients,
        "warmup": {"ok": warmup.ok, "latency_s": warmup.latency_s, "error": warmup.error},
        "outputs_equal": all(equal) if equal else None,
        "levels": levels,
        "table": table_rows(levels),
    }
