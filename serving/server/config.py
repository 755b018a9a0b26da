"""The serving config (``configs/serving.yaml``), typed and validated at load."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from serving.defaults import DEFAULT_HARDWARE, DEFAULT_K, DEFAULT_POLICY, DEFAULT_TARGET
from serving.engine.drafters.plan import CascadePlan, DraftPlan
from serving.engine.policy import MAX_DRAFT_TOKENS, PolicyName
from serving.errors import BadInputError
from serving.paths import CONFIG_DIR
from serving.security.keys import DEFAULT_KEY_ENV
from serving.security.redact import RedactionPatternError, Redactor

SERVING_CONFIG = CONFIG_DIR / "serving.yaml"

# A replica name goes into capture run ids and so into part file names, as is.
REPLICA_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChampionConfig(_Section):
    source: Literal["static", "local", "registry"] = "static"
    drafter: str = "pld"  # static: the drafter spec
    policy: PolicyName = DEFAULT_POLICY
    k: int = Field(DEFAULT_K, ge=1, le=MAX_DRAFT_TOKENS)
    path: Path | None = None  # local: the champion pointer file
    poll_s: float = Field(5.0, gt=0)
    # registry: while the target has no champion yet, refuse to start ("fail") or serve
    # plain decoding and swap to the first champion once one is promoted ("plain"): a
    # replica may then come up before anyone bootstraps the target.
    missing: Literal["fail", "plain"] = "fail"

    @model_validator(mode="after")
    def _path_for_local(self) -> ChampionConfig:
        if self.source == "local" and self.path is None:
            raise ValueError("champion.source 'local' needs champion.path (the pointer file)")
        if self.source == "static":  # the plan is refused here, before any weights load
            try:
                DraftPlan.parse(self.drafter, policy=self.policy, k=self.k)
            except BadInputError as error:
                raise ValueError(f"champion.drafter {self.drafter!r}: {error}") from None
        return self


class Limits(_Section):
    max_tokens: int = Field(1024, ge=1)
    queue_size: int = Field(32, ge=1)
    max_active: int = Field(8, ge=1)
    workers: int = Field(1, ge=1)  # decode threads (see serving/server/scheduler.py)
    request_timeout_s: float = Field(300.0, gt=0)
    # Checked before the body is parsed (bytes) or tokenised (messages, characters).
    max_body_bytes: int = Field(1 << 20, ge=1024)
    # Nesting of JSON arrays/objects, counted before the body is parsed (a deeper one is a
    # 400, never the parser's recursion); a chat request with tools nests about 8 deep.
    max_json_depth: int = Field(64, ge=4, le=512)
    # Token buckets per API key (per client address without keys), checked before the body
    # is read; a request past its bucket gets 429 with Retry-After. None: off (the full
    # queue is refused before parsing anyway); see docs/security.md for when to set it.
    rate_per_s: float | None = Field(None, gt=0)
    burst: int = Field(16, ge=1)
    # A 429 is held this long before it is sent: a client that retries at once is paced to
    # one request per delay, at no CPU cost (serving/security/admission.py). 0: at once.
    refusal_delay_s: float = Field(1.0, ge=0.0, le=30.0)
    max_messages: int = Field(256, ge=1)
    max_prompt_chars: int = Field(100_000, ge=1)


class CaptureConfig(_Section):
    share: float = Field(0.0, ge=0.0, le=1.0)
    store: Path = Path("data")
    failure_threshold: float = Field(0.5, ge=0.0, le=1.0)
    seed: int = 0
    # Redaction before a record is written (serving/security/redact.py): the built-in
    # patterns (e-mail addresses, API-key-like tokens) and these extra regular expressions.
    redact: bool = True
    redact_patterns: list[str] = Field(default_factory=list)

    @field_validator("redact_patterns")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        try:
            Redactor(patterns, builtins=False)
        except RedactionPatternError as error:
            raise ValueError(str(error)) from None
        return patterns


class SecurityConfig(_Section):
    """Who may call the server (docs/security.md). Keys come from the environment variable
    ``api_key_env`` and/or the file ``api_key_file`` (mode 600), never from the command
    line; with none, the server answers anyone and refuses to bind beyond loopback unless
    ``allow_unauthenticated``. With ``tls_cert`` and ``tls_key`` it serves HTTPS itself."""

    api_key_env: str = Field(DEFAULT_KEY_ENV, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    api_key_file: Path | None = None
    metrics_open: bool = False  # /metrics without a key (for a scraper); /health always is
    allow_unauthenticated: bool = False
    # TLS served by the server itself (uvicorn's): a PEM certificate chain and its key
    # (unencrypted, mode 600), both or neither; the files are checked by server_tls.
    tls_cert: Path | None = None
    tls_key: Path | None = None

    @model_validator(mode="after")
    def _tls_pair(self) -> SecurityConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: give both or neither")
        return self


class CascadeConfig(_Section):
    """The draft cascade requests get with ``drafter: "cascade"`` (off when no stages)."""

    stages: str | None = None  # e.g. "suffix,pld:3,ngram:4"
    k_max: int = Field(8, ge=1, le=MAX_DRAFT_TOKENS)
    predictor: Literal["none", "local", "registry"] = "none"
    predictor_path: Path | None = None  # local: the predictor folder
    poll_s: float = Field(30.0, gt=0)

    @model_validator(mode="after")
    def _path_for_local(self) -> CascadeConfig:
        if self.predictor == "local" and self.predictor_path is None:
            raise ValueError("cascade.predictor 'local' needs cascade.predictor_path")
        if self.predictor != "none" and self.stages is None:
            raise ValueError("cascade.predictor needs cascade.stages")
        if self.stages is not None:  # refused here, before any weights load
            try:
                CascadePlan.parse(self.stages, k=self.k_max)
            except BadInputError as error:
                raise ValueError(f"cascade.stages {self.stages!r}: {error}") from None
        return self


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    model_name: str = Field(DEFAULT_TARGET, min_length=1)
    target: str = DEFAULT_TARGET
    hardware: str = DEFAULT_HARDWARE  # a name in configs/hardware.yaml, resolved at start
    # Which deployment this process is, when several serve one registry and capture into
    # one store (e.g. "eu-1"); it prefixes the capture run id. None: the host name alone
    # (with the pid and a random token) keeps replicas' parts apart.
    replica: str | None = Field(None, pattern=REPLICA_PATTERN)
    threads: int | None = Field(None, ge=1)  # torch threads per decode worker
    champion: ChampionConfig = Field(default_factory=lambda: ChampionConfig())
    limits: Limits = Field(default_factory=lambda: Limits())
    capture: CaptureConfig = Field(default_factory=lambda: CaptureConfig())
    cascade: CascadeConfig = Field(default_factory=lambda: CascadeConfig())
    security: SecurityConfig = Field(default_factory=lambda: SecurityConfig())


def load_server_config(path: str | Path = SERVING_CONFIG, **overrides: object) -> ServerConfig:
    """Load ``path``, apply dotted overrides (``{"limits.queue_size": 4}``), validate."""
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise BadInputError(f"cannot read serving config {str(path)!r}: {error}") from None
    for dotted, value in overrides.items():
        if value is None:
            continue
        section = raw
        *parents, leaf = dotted.split(".")
        for key in parents:
            section = section.setdefault(key, {})
        section[leaf] = value
    try:
        return ServerConfig.model_validate(raw)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in error.errors()
        )
        raise BadInputError(f"invalid serving config {str(path)!r}: {problems}") from None
