"""OpenAI-compatible request bodies, validated at the edge.

Standard fields follow the OpenAI API (and its defaults: ``temperature`` 1, completions'
``max_tokens`` 16). specops's own fields ride in the body (``extra_body`` in the
``openai`` client):

- ``drafter``: ``champion`` (default: the promoted draft of this hardware target),
  ``cascade`` (the server's configured cascade), or the spec of a drafter kind without
  files (:data:`serving.engine.drafters.kinds.HTTP_KINDS`: ``none`` turns speculation off; an
  n-gram spec without a shared store); drafters that load files are not accepted over
  HTTP: promote them;
- ``num_speculative_tokens``: k (1..64) for the draft-length policy;
- ``draft_policy``: one of :data:`serving.engine.policy.POLICIES`;
- ``capture``: ``false`` opts this request out of capture (so does OpenAI's ``store``
  set to ``false``, and the header ``X-SpecOps-Capture: off``), always honoured.

Fields of the OpenAI API that specops does not implement are refused with a 400 when set
to anything but their no-op value, rather than silently ignored; unknown fields are
ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serving.engine.drafters.kinds import HTTP_KINDS, split_spec
from serving.engine.policy import MAX_DRAFT_TOKENS, PolicyName
from serving.engine.relaxed import check_lambda
from serving.errors import BadInputError
from serving.security.asgi import error_body as error_body  # one error shape for all

HTTP_DRAFTERS = ("champion", *HTTP_KINDS, "cascade")


class StreamOptions(BaseModel):
    include_usage: bool = False


class SpecOpsFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # vLLM's extension; -1 or 0 disables
    seed: int | None = None
    stop: str | list[str] | None = Field(None, validate_default=True)  # -> list[str]
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # specops's own
    drafter: str = "champion"
    num_speculative_tokens: int | None = Field(None, ge=1, le=MAX_DRAFT_TOKENS)
    draft_policy: PolicyName | None = None
    # Opt-in relaxed verification (greedy only): keep a disagreeing draft when λ times its
    # log-probability gap is below the passes it saves; None (default) is lossless.
    relax_lambda: float | None = None
    # Skeleton-of-thought (chat only, not streamed): a constrained plan, then its points
    # decoded as a batch and merged (docs/skeleton.md).
    skeleton: bool = False
    # Consent: false keeps this request out of the capture store, whatever the share.
    capture: bool = True
    store: bool | None = None  # OpenAI's field; an explicit false opts out too

    @field_validator("relax_lambda")
    @classmethod
    def _relax(cls, value: float | None) -> float | None:
        if value is None:
            return None
        try:
            return check_lambda(value)
        except BadInputError as error:
            raise ValueError(str(error)) from None

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> list[str]:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > 4:
            raise ValueError(f"at most 4 stop sequences, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop sequences must be non-empty strings")
        return stops

    @field_validator("drafter")
    @classmethod
    def _drafter(cls, drafter: str) -> str:
        kind = split_spec(drafter)[0].lower()
        if kind not in HTTP_DRAFTERS:
            raise ValueError(
                f"drafter {drafter!r} is not available per request; choose one of "
                f"{HTTP_DRAFTERS} (drafters with files are served by promoting them)"
            )
        if kind == "ngram" and re.search(
            r"(?i)(^|[:,])\s*(store\s*=|fallback\s*=\s*shared)", drafter
        ):
            raise ValueError(
                f"drafter {drafter!r}: a shared n-gram store is a file, not accepted per "
                "request; promote a draft package that carries it (fallback=stop|target "
                "and min_conf are accepted here)"
            )
        return drafter.strip()

    @model_validator(mode="after")
    def _unsupported(self) -> SpecOpsFields:
        if self.n != 1:
            raise ValueError(f"n={self.n} is not supported; specops returns one choice (n=1)")
        if self.presence_penalty or self.frequency_penalty:
            raise ValueError(
                "presence_penalty and frequency_penalty are not supported (they change the "
                "target's distribution, so speculation could not stay lossless)"
            )
        if self.logit_bias:
            raise ValueError("logit_bias is not supported")
        if self.max_tokens is None and self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        return self

    @property
    def stops(self) -> list[str]:
        """``stop`` after validation: always a list."""
        return self.stop if isinstance(self.stop, list) else []

    @property
    def opted_out(self) -> bool:
        return not self.capture or self.store is False

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SpecOpsFields):
    prompt: str | list[str]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: str | list[str]) -> str:
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise ValueError(f"one prompt per request, got a list of {len(prompt)}")
            prompt = prompt[0]
        if not prompt.strip():
            raise ValueError("the prompt is empty")
        return prompt

    @model_validator(mode="after")
    def _completion_unsupported(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported")
        if self.logprobs:
            raise ValueError("logprobs is not supported")
        if self.best_of not in (None, 1):
            raise ValueError(f"best_of={self.best_of} is not supported")
        if self.suffix:
            raise ValueError("suffix is not supported")
        return self


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict[str, object]]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        parts: list[str] = []
        for part in self.content:
            text = part.get("text")
            if part.get("type") != "text" or not isinstance(text, str):
                raise ValueError(f"only text content parts are supported, got {part!r}")
            parts.append(text)
        return "".join(parts)


class ChatCompletionRequest(SpecOpsFields):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    tools: list[dict[str, object]] | None = None

    @model_validator(mode="after")
    def _chat_unsupported(self) -> ChatCompletionRequest:
        if self.logprobs:
            raise ValueError("logprobs is not supported")
        if self.tools:
            raise ValueError("tools are not supported")
        for message in self.messages:
            message.text()  # content parts other than text fail here
        return self

    def as_template_messages(self) -> list[dict[str, str]]:
        # "developer" is the newer name of "system"; chat templates know "system".
        return [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in self.messages
        ]


def prompt_chars(body: SpecOpsFields) -> int:
    """The characters a request asks the server to tokenise (its prompt or messages)."""
    if isinstance(body, CompletionRequest):
        return len(body.prompt) if isinstance(body.prompt, str) else sum(map(len, body.prompt))
    assert isinstance(body, ChatCompletionRequest)
    return sum(len(m.text()) for m in body.messages)
