"""What the front captures of one request: the token ids read from vLLM's answer, and the
record of the request/response pair.

The front asks vLLM for the token ids (``return_token_ids``); a :class:`Transcript` reads
them, the finish reason and vLLM's per-request ``metrics.speculative_decoding`` from the
answer (a JSON body, or server-sent events as they stream through) and, when the client did
not ask for the ids, removes them from what the client gets. :meth:`Transcript.record` is
the pair the front hands its capture.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from serving.hardware import HardwareTarget

TOKEN_ID_FIELDS = ("prompt_token_ids", "token_ids")


def strip_ids(payload: Any) -> Any:
    """``payload`` without the token-id fields the front asked for."""
    if isinstance(payload, dict):
        payload.pop("prompt_token_ids", None)
        for choice in payload.get("choices") or []:
            if isinstance(choice, dict):
                for name in TOKEN_ID_FIELDS:
                    choice.pop(name, None)
    return payload


def _acceptance(speculation: dict[str, Any] | None) -> dict[str, Any]:
    """The request's own drafting, from vLLM's per-request metrics (absent: not reported)."""
    if not speculation:
        return {}
    try:
        return {
            "draft_tokens": int(speculation["num_draft_tokens"]),
            "accepted_tokens": int(speculation["num_accepted_draft_tokens"]),
            "per_step_drafted": [int(n) for n in speculation.get("per_step_drafted", [])],
            "per_step_accepted": [int(n) for n in speculation.get("per_step_accepted", [])],
        }
    except (KeyError, TypeError, ValueError):
        return {}


class Transcript:
    """What one captured request produced: prompt and output ids, finish reason."""

    def __init__(self) -> None:
        self.prompt: list[int] | None = None
        self.output: list[int] = []
        self.finish_reason: str | None = None
        self.speculation: dict[str, Any] | None = None  # vLLM's metrics.speculative_decoding

    def read(self, payload: dict[str, Any]) -> None:
        if isinstance(payload.get("prompt_token_ids"), list):
            self.prompt = payload["prompt_token_ids"]
        metrics = payload.get("metrics")
        if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
            self.speculation = metrics["speculative_decoding"]
        for choice in payload.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if isinstance(choice.get("prompt_token_ids"), list):
                self.prompt = choice["prompt_token_ids"]
            if isinstance(choice.get("token_ids"), list):
                self.output.extend(int(t) for t in choice["token_ids"])
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def read_answer(self, content: bytes, *, strip: bool) -> bytes:
        """Read a whole JSON answer; the answer to send on (``strip``: without the ids)."""
        try:
            payload = json.loads(content)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return content
        if isinstance(payload, dict):
            self.read(payload)
            if strip:
                return json.dumps(strip_ids(payload)).encode()
        return content

    def read_event(self, event: bytes, *, strip: bool) -> bytes:
        """Read one server-sent event; the event to send on (``strip``: without the ids)."""
        if not event.startswith(b"data: ") or event.strip() == b"data: [DONE]":
            return event
        try:
            payload = json.loads(event[len(b"data: ") :])
        except (json.JSONDecodeError, UnicodeDecodeError):
            return event
        if not isinstance(payload, dict):
            return event
        self.read(payload)
        return b"data: " + json.dumps(strip_ids(payload)).encode() if strip else event

    def record(
        self,
        request: dict[str, Any],
        *,
        server: str,
        champion: str,
        speculative_config: dict[str, Any] | None,
        hardware: HardwareTarget | None,
        started: float,
    ) -> dict[str, Any] | None:
        """The captured pair of ``request`` (the parsed body sent upstream) and this answer,
        served by ``server`` on ``hardware`` (its name is stored; "" for None) since
        ``started``; None without a prompt or an output."""
        if not self.prompt or not self.output:
            return None
        return {
            "id": f"{server}-{uuid.uuid4().hex}",
            "timestamp": started,
            "latency_s": round(time.time() - started, 6),
            "hardware": "" if hardware is None else hardware.name,
            "champion": champion,
            "server": server,
            "speculative_method": (speculative_config or {}).get("method", "none"),
            "prompt_token_ids": [int(t) for t in self.prompt],
            "output_token_ids": self.output,
            "finish_reason": self.finish_reason,
            **_acceptance(self.speculation),
            "sampling": {
                "temperature": request.get("temperature", 1.0),
                "top_p": request.get("top_p", 1.0),
                "seed": request.get("seed"),
                "max_tokens": request.get("max_tokens", request.get("max_completion_tokens")),
            },
        }
