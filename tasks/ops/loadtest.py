"""A load test of a specops server on loopback, through the official ``openai`` client.

N concurrent clients send M chat requests in all (real prompts: a workload's held-out
split), each streamed so that time to first token is measured. Reported: throughput
(requests/s and completion tokens/s over the wall time), latency and TTFT percentiles,
errors by kind, pooled acceptance from the responses' ``usage``, and the server's peak
resident memory (sampled from its ``/metrics``). Bounded in count and in time: every
request has a timeout and the run stops after ``requests``.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from serving.errors import BadInputError

RSS_PATTERN = re.compile(r"^process_resident_memory_bytes\s+([0-9.e+]+)", re.MULTILINE)


@dataclass
class LoadTestSettings:
    url: str = "http://127.0.0.1:8000"
    model: str = "smollm2"
    clients: int = 4
    requests: int = 32
    max_tokens: int = 64
    temperature: float = 0.0
    workload: str = "sharegpt"
    seed: int = 0
    timeout_s: float = 300.0
    drafter: str | None = None  # None: the server's champion
    prompts: list[str] = field(default_factory=list)  # empty: the workload's held-out prompts

    def check(self) -> None:
        for name in ("clients", "requests", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadInputError(f"{name} must be an integer >= 1, got {value!r}")
        if not self.url.startswith(("http://127.", "http://localhost", "http://[::1]")):
            raise BadInputError(
                f"the load test only targets loopback addresses, got url={self.url!r}"
            )


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
    extra: dict[str, Any] = {}
    if settings.drafter:
        extra["drafter"] = settings.drafter
    ttft = None
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
            if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.perf_counter() - started
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
    )


async def _sample_memory(url: str, stop: asyncio.Event, peaks: list[float]) -> None:
    import httpx

    async with httpx.AsyncClient(timeout=5.0) as http:
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


async def run_load_test(settings: LoadTestSettings, *, progress: bool = True) -> dict[str, Any]:
    from openai import AsyncOpenAI
    from tqdm.auto import tqdm

    settings.check()
    prompts = load_prompts(settings)
    if not prompts:
        raise BadInputError("the load test has no prompts")
    client = AsyncOpenAI(
        base_url=f"{settings.url}/v1",
        api_key="specops",  # the server does not check keys; the client needs one
        max_retries=0,  # a 429 is a result here, not something to hide
        timeout=settings.timeout_s,
    )
    samples: list[_Sample] = []
    bar = tqdm(total=settings.requests, desc="load test", unit="req", disable=not progress)
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < settings.requests:
            index = next_index
            next_index += 1
            samples.append(await _one(client, settings, prompts[index % len(prompts)]))
            bar.update()

    stop = asyncio.Event()
    memory: list[float] = []
    sampler = asyncio.create_task(_sample_memory(settings.url, stop, memory))
    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(settings.clients)))
    finally:
        wall = time.perf_counter() - started
        stop.set()
        await sampler
        bar.close()
        await client.close()
    return summarize(settings, samples, wall, memory)


def summarize(
    settings: LoadTestSettings, samples: list[_Sample], wall_s: float, memory: list[float]
) -> dict[str, Any]:
    ok = [s for s in samples if s.ok]
    latencies = [s.latency_s for s in ok]
    ttfts = [s.ttft_s for s in ok if s.ttft_s is not None]
    tokens = sum(s.completion_tokens for s in ok)
    drafted = sum(s.draft_tokens for s in ok)
    accepted = sum(s.accepted_tokens for s in ok)
    checks = sum(s.checks for s in ok)
    return {
        "settings": {k: v for k, v in asdict(settings).items() if k != "prompts"},
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
