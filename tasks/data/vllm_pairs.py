"""Request/response pairs captured in front of vLLM, as training sequences.

The front (:mod:`serving.gateway.front`) records, per completion, the prompt as vLLM
tokenized it and the target's answer (``vllm-pairs/`` parts of the store). vLLM says
nothing per request about its drafts, so a pair is not a request record (no per-token
provenance, nothing to validate acceptance against); what it is good for is teaching a
draft the target's own answers, which is all the learned challengers' teacher data needs
(``id``, ``prompt_token_ids``, ``output_token_ids``: :mod:`tasks.train.store_teacher`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serving.gateway.sink import PAIRS, area_parts
from serving.hardware import HardwareTarget

log = logging.getLogger(__name__)


class Pair(BaseModel):
    """One completion captured in front of vLLM (the front writes more fields; they are kept)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    id: str = Field(min_length=1)
    timestamp: float
    hardware: str
    champion: str
    prompt_token_ids: list[int] = Field(min_length=1)
    output_token_ids: list[int] = Field(min_length=1)


def read_pairs(store: Path, hardware: HardwareTarget) -> tuple[list[Pair], list[str]]:
    """The valid pairs of ``hardware`` (oldest first, each id once) and one reason per line
    that was not one (the line is left where it is and never trained on)."""
    pairs: dict[str, Pair] = {}
    rejected: list[str] = []
    for part in area_parts(store, PAIRS, hardware):
        for number, line in enumerate(part.read_text(errors="replace").splitlines(), start=1):
            try:
                pair = Pair.model_validate(json.loads(line))
            except json.JSONDecodeError as error:
                rejected.append(f"{part.name}:{number}: not JSON ({error})")
                continue
            except ValidationError as error:
                reasons = "; ".join(
                    f"{'.'.join(map(str, e['loc'])) or 'line'}: {e['msg']}" for e in error.errors()
                )
                rejected.append(f"{part.name}:{number}: {reasons}")
                continue
            if any(t < 0 for t in pair.prompt_token_ids + pair.output_token_ids):
                rejected.append(f"{part.name}:{number}: negative token id")
                continue
            pairs.setdefault(pair.id, pair)
    for reason in rejected[:5]:
        log.warning("skipped captured pair %s", reason)
    return sorted(pairs.values(), key=lambda p: (p.timestamp, p.id)), rejected
