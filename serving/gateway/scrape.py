"""vLLM's speculative-decoding counters, read from its Prometheus ``/metrics``.

vLLM counts, per engine, the drafts it made (``vllm:spec_decode_num_drafts``), the tokens
they proposed (``..._num_draft_tokens``), those accepted (``..._num_accepted_tokens``) and
those accepted at each draft position (``..._num_accepted_tokens_per_pos``), plus finished
requests (``vllm:request_success``). :func:`read_counters` sums them over engines and
labels; :func:`window` turns two readings of one server into what happened between them,
the unit the acceptance tracker pools (``accepted / drafted``, as for specops records).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from serving.hardware import HardwareTarget

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
REQUESTS = "vllm:request_success"


@dataclass(frozen=True)
class Counters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    requests: float = 0.0
    accepted_per_position: tuple[float, ...] = ()


def read_counters(text: str) -> Counters:
    """Sum vLLM's spec-decode and request counters in a ``/metrics`` page."""
    totals = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0, REQUESTS: 0.0}
    positions: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue  # _created timestamps
            name = sample.name.removesuffix("_total")
            if name in totals:
                totals[name] += float(sample.value)
            elif name == PER_POSITION:
                position = int(sample.labels.get("position", 0))
                positions[position] = positions.get(position, 0.0) + float(sample.value)
    per_position = tuple(positions.get(i, 0.0) for i in range(max(positions, default=-1) + 1))
    return Counters(
        drafts=totals[DRAFTS],
        draft_tokens=totals[DRAFT_TOKENS],
        accepted_tokens=totals[ACCEPTED],
        requests=totals[REQUESTS],
        accepted_per_position=per_position,
    )


@dataclass(frozen=True)
class Window:
    """What one server did between two readings."""

    start: float
    end: float
    hardware: str
    champion: str
    server: str
    requests: int
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: list[int] = field(default_factory=list)

    @property
    def acceptance(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "acceptance": self.acceptance}


def window(
    before: Counters,
    after: Counters,
    *,
    start: float,
    end: float,
    hardware: HardwareTarget,
    champion: str,
    server: str,
) -> Window:
    """``after - before`` of one server on ``hardware`` (the window keeps its name); a
    counter that went down (the server restarted under the same name) counts from zero."""

    def delta(a: float, b: float) -> int:
        return round(b - a) if b >= a else round(b)

    positions = [
        delta(before.accepted_per_position[i] if i < len(before.accepted_per_position) else 0, v)
        for i, v in enumerate(after.accepted_per_position)
    ]
    return Window(
        start=start,
        end=end,
        hardware=hardware.name,
        champion=champion,
        server=server,
        requests=delta(before.requests, after.requests),
        drafts=delta(before.drafts, after.drafts),
        draft_tokens=delta(before.draft_tokens, after.draft_tokens),
        accepted_tokens=delta(before.accepted_tokens, after.accepted_tokens),
        accepted_per_position=positions,
    )
