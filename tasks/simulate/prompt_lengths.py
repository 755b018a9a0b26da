"""Prompt lengths for ``specops distributed bench`` results written before the bench
recorded them (``specops simulate calibrate`` needs each request's): rebuilt from the
results' settings, the same seeded workload encoded the same way."""

from __future__ import annotations

from typing import Any

from serving.loader import encode_prompt
from tasks.data.traffic import build_workload
from tasks.distributed_records import DistributedBenchResults


def fill_prompt_lengths(measured: DistributedBenchResults, tokenizer: Any = None) -> None:
    """Give every request of ``measured`` without one its ``prompt_tokens``, in place.
    ``tokenizer``: the bench's (default: the shipped model's, loaded only when needed)."""
    requests = [r for p in measured.get("points", []) for r in p.get("per_request", [])]
    if all("prompt_tokens" in r for r in requests):
        return
    if tokenizer is None:
        from transformers import AutoTokenizer

        from serving.models.real import real_model_dir

        tokenizer = AutoTokenizer.from_pretrained(real_model_dir(progress=False))
    settings = measured["settings"]
    # The bench built its workload for its most requests (at least two per session).
    count = max(max(settings["requests"], 2 * s) for s in settings["sessions"])
    prompts = build_workload(settings["workload"], min(count, 64), seed=settings["seed"])
    lengths = [len(encode_prompt(tokenizer, p.user_text)) for p in prompts]
    for request in requests:
        request["prompt_tokens"] = lengths[request["prompt"] % len(lengths)]
