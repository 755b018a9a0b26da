"""The simulation scenario (``configs/simulate.yaml``), typed and validated at load.

A bad value fails at load time with its dotted field path (``targets.0.batch_curve``), as
:func:`serving.server.config.load_server_config` does for the serving config.
"""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from serving.curves import PassCost
from serving.errors import BadInputError

RouterName = Literal["round_robin", "jsq2", "weighted_jsq2"]
Mode = Literal["distributed", "fused"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TargetDevice(_Section):
    """One kind of target server; ``count`` identical replicas of it."""

    name: str = Field(min_length=1)
    # A `specops profile --batch` results JSON (measurements/profile-batch.json): batch_curve and
    # one_token_pass_s are taken from it unless given here. Relative to the config file.
    profile: Path | None = None
    one_token_pass_s: float | None = Field(None, gt=0)  # seconds of a one-token target pass
    # [rows, cost] points from rows = 1, cost relative to a one-token pass (the meaning of
    # batch_curve in configs/hardware.yaml); evaluated by serving.engine.batch.plan.PassCost.
    batch_curve: list[tuple[int, float]] | None = Field(None, min_length=1)
    # [rows, sequences, cost] measured passes (the profile's table), cost relative to a
    # one-token pass: when given, a pass's cost depends on how many sequences share its
    # rows too (one sequence's 8 rows cost less than 8 sequences' 8 rows). Taken from
    # `profile` when batch_curve is too.
    pass_table: list[tuple[int, int, float]] | None = Field(None, min_length=1)
    prefill_s_per_token: float = Field(0.0, ge=0)
    # [tokens, seconds] measured prefills (a profile's `prefill`): when given, a pass's
    # prefill tokens are priced along it (linear between points, extended at the last
    # segment's slope) instead of at prefill_s_per_token. Taken from `profile` when it has
    # one and prefill_s_per_token is not given.
    prefill_curve: list[tuple[int, float]] | None = Field(None, min_length=1)
    max_batch: int = Field(8, ge=1)  # requests in one pass
    max_tokens_per_pass: int = Field(64, ge=1)  # pending tokens plus drafts, all requests
    count: int = Field(1, ge=1)  # replicas

    @model_validator(mode="after")
    def _curve_and_pass_time(self, info: ValidationInfo) -> TargetDevice:
        if self.profile is not None:
            base = (info.context or {}).get("base_dir")
            path = (
                self.profile if base is None or self.profile.is_absolute() else base / self.profile
            )
            measured = read_profile(path)
            if self.prefill_curve is None and "prefill_s_per_token" not in self.model_fields_set:
                self.prefill_curve = read_prefill(path)
            if self.batch_curve is None:
                self.batch_curve = measured[1]
                if self.pass_table is None:
                    self.pass_table = measured[2]
            if self.one_token_pass_s is None:
                self.one_token_pass_s = measured[0]
        if self.batch_curve is None:
            raise ValueError(
                "batch_curve: missing; give batch_curve ([rows, cost] points from rows 1) or "
                "profile (a `specops profile --batch` results JSON)"
            )
        if self.one_token_pass_s is None:
            raise ValueError(
                "one_token_pass_s: missing; give it or a profile (a `specops profile "
                "--batch` results JSON) to take it from"
            )
        try:
            PassCost(batch_curve=tuple(self.batch_curve))
        except BadInputError as error:
            raise ValueError(f"batch_curve: {error}") from None
        if self.max_tokens_per_pass < self.max_batch:
            raise ValueError(
                f"max_tokens_per_pass ({self.max_tokens_per_pass}) must be at least max_batch "
                f"({self.max_batch}): every request's pending token rides in the pass"
            )
        return self

    def prefill_s(self, tokens: int) -> float:
        """Seconds to prefill ``tokens`` prompt tokens (0 for none)."""
        if tokens <= 0:
            return 0.0
        curve = self.prefill_curve
        if not curve:
            return tokens * self.prefill_s_per_token
        if tokens < curve[0][0]:  # below the shortest measured prompt: in proportion to it
            return curve[0][1] * tokens / curve[0][0]
        return _along(curve, tokens)

    def pass_grid(self) -> list[list[float]]:
        """``grid[sequences][rows]``: seconds of a pass over ``rows`` decode rows shared by
        ``sequences`` requests, for rows up to ``max_tokens_per_pass`` and sequences up to
        ``max_batch`` (0 rows: 0 s). From ``pass_table`` when given: linear in rows within
        each measured sequence count (extended at the last segment's slope), linear in
        sequences between measured counts (held outside them). Otherwise ``C(rows)``."""
        rows_range = range(self.max_tokens_per_pass + 1)
        if not self.pass_table:
            curve = self.pass_cost()
            line = [0.0] + [self.pass_s * curve(n) for n in rows_range[1:]]
            return [line] * (self.max_batch + 1)
        by_sequences: dict[int, list[tuple[int, float]]] = {}
        for rows, sequences, relative in sorted(self.pass_table):
            by_sequences.setdefault(sequences, []).append((rows, relative))
        measured = sorted(by_sequences)

        grid = []
        for sequences in range(self.max_batch + 1):
            low = max([s for s in measured if s <= sequences], default=measured[0])
            high = min([s for s in measured if s >= sequences], default=measured[-1])
            line = [0.0]
            for n in rows_range[1:]:
                a = _along(by_sequences[low], n)
                b = _along(by_sequences[high], n)
                t = 0.0 if high == low else (sequences - low) / (high - low)
                line.append(self.pass_s * (a + t * (b - a)))
            grid.append(line)
        return grid

    def pass_cost(self) -> PassCost:
        """``C(n)``: a pass over ``n`` rows, in one-token passes."""
        return PassCost(batch_curve=tuple(self.batch_curve or ()))

    @property
    def pass_s(self) -> float:
        """Seconds of a one-token pass (set once validated)."""
        assert self.one_token_pass_s is not None
        return self.one_token_pass_s


def _along(points: list[tuple[int, float]], x: float) -> float:
    """Piecewise-linear through ``points`` (sorted ``(x, y)``), held below the first and
    extended at the last segment's slope past the last (as ``PassCost`` extends a curve)."""
    xs = [float(p) for p, _ in points]
    ys = [y for _, y in points]
    if len(points) > 1 and x > xs[-1]:
        return ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (x - xs[-1])
    return float(np.interp(x, xs, ys))


def read_prefill(path: Path) -> list[tuple[int, float]] | None:
    """A profile's measured prefills ``[tokens, seconds]``; None for an older profile."""
    try:
        rows = json.loads(path.read_text()).get("prefill")
        return [(int(n), float(seconds)) for n, seconds in rows] if rows else None
    except (OSError, ValueError, TypeError, AttributeError) as error:
        raise ValueError(f"profile: cannot read prefills from {str(path)!r}: {error!r}") from None


def read_profile(
    path: Path,
) -> tuple[float, list[tuple[int, float]], list[tuple[int, int, float]]]:
    """``(one_token_pass_s, batch_curve, pass_table)`` from a ``specops profile --batch``
    results JSON (the table as ``[rows, sequences, cost]``)."""
    try:
        measured = json.loads(path.read_text())
        curve = [(int(rows), float(cost)) for rows, cost in measured["batch_curve"]]
        single = [
            row["pass_s"] for row in measured["table"] if row["rows"] == 1 and row["sequences"] == 1
        ]
        table = [
            (int(row["rows"]), int(row["sequences"]), float(row["cost"]))
            for row in measured["table"]
        ]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"profile: cannot read a `specops profile --batch` result from {str(path)!r}: {error!r}"
        ) from None
    if not single:
        raise ValueError(f"profile: {str(path)!r} has no one-row, one-sequence pass in its table")
    return float(single[0]), curve, table


class Drafter(_Section):
    """A draft model as the simulator sees it: how far it drafts, how often it is right."""

    name: str = Field(min_length=1)
    # Chance draft i is kept given drafts 0..i-1 were: at least k entries.
    acceptance_by_position: list[Annotated[float, Field(ge=0.0, le=1.0)]] = Field(
        default_factory=list
    )
    k: int = Field(ge=0)  # draft length per round
    draft_s_per_token: float = Field(0.0, ge=0)  # on the draft device
    share: float = Field(1.0, gt=0)  # relative share of the client sessions using it
    # How often a round proposes j = 0, 1, ... drafts (relative shares, at most k + 1 of
    # them): an n-gram drafter often finds nothing to propose. None: every round drafts k.
    block_shares: list[Annotated[float, Field(ge=0.0)]] | None = None

    @model_validator(mode="after")
    def _enough_positions(self) -> Drafter:
        if len(self.acceptance_by_position) < self.k:
            raise ValueError(
                f"acceptance_by_position: {len(self.acceptance_by_position)} entries for k = "
                f"{self.k}; give one probability per draft position"
            )
        if self.block_shares is not None and (
            not 0 < len(self.block_shares) <= self.k + 1 or sum(self.block_shares) <= 0
        ):
            raise ValueError(
                f"block_shares: {self.block_shares} must give 1 to k + 1 = {self.k + 1} "
                "shares (rounds proposing 0, 1, ... drafts), not all zero"
            )
        return self


class Link(_Section):
    rtt_s: float = Field(0.0, ge=0)  # round trip between a draft client and a target server


TokenCount = int | list[int]


class _Lengths(_Section):
    # Fixed, or a list to sample from uniformly (seeded).
    prompt_tokens: TokenCount = 0
    output_tokens: TokenCount = 1
    max_requests: int | None = Field(None, ge=1)  # stop arriving after this many

    @field_validator("prompt_tokens", "output_tokens")
    @classmethod
    def _counts(cls, value: TokenCount, info: ValidationInfo) -> TokenCount:
        values = value if isinstance(value, list) else [value]
        least = 1 if info.field_name == "output_tokens" else 0
        if not values or any(v < least for v in values):
            raise ValueError(f"must be >= {least} (or a non-empty list of such), got {value}")
        return value


class PoissonArrivals(_Lengths):
    kind: Literal["poisson"] = "poisson"
    rate_per_s: float = Field(gt=0)


class TraceArrivals(_Lengths):
    kind: Literal["trace"] = "trace"
    timestamps: list[Annotated[float, Field(ge=0)]] = Field(min_length=1)
    # sample: a length list is sampled from, as for the other kinds. per_request: a length
    # list gives request i's length, one entry per timestamp (replaying a measured run).
    lengths: Literal["sample", "per_request"] = "sample"

    @field_validator("timestamps")
    @classmethod
    def _sorted(cls, timestamps: list[float]) -> list[float]:
        if any(b < a for a, b in pairwise(timestamps)):
            raise ValueError("must be non-decreasing")
        return timestamps

    @model_validator(mode="after")
    def _one_length_per_request(self) -> TraceArrivals:
        if self.lengths == "per_request":
            for name in ("prompt_tokens", "output_tokens"):
                value = getattr(self, name)
                if isinstance(value, list) and len(value) != len(self.timestamps):
                    raise ValueError(
                        f"{name}: {len(value)} entries for {len(self.timestamps)} timestamps; "
                        "with lengths: per_request give one per timestamp (or one number "
                        "for all)"
                    )
        return self


class ClosedArrivals(_Lengths):
    """``clients`` closed-loop clients: each sends a request, waits for its whole answer,
    thinks ``think_s``, then sends the next (a load test with that many concurrent
    clients; that many draft devices)."""

    kind: Literal["closed"] = "closed"
    clients: int = Field(ge=1)
    think_s: float = Field(0.0, ge=0)  # from an answer's last token to the next request
    requests_per_client: int | None = Field(None, ge=1)  # None: keep sending to duration_s
    ramp_s: float = Field(0.0, ge=0)  # client i sends its first request at i * ramp_s / clients
    # sample: lengths drawn per request. per_request: the n-th request sent (by any client)
    # takes entry n of each length list, and max_requests defaults to their length (a
    # measured closed-loop run replayed: its clients shared one queue of requests).
    lengths: Literal["sample", "per_request"] = "sample"

    @model_validator(mode="after")
    def _enough_lengths(self) -> ClosedArrivals:
        if self.lengths != "per_request":
            return self
        counts = {
            name: len(value)
            for name in ("prompt_tokens", "output_tokens")
            if isinstance(value := getattr(self, name), list)
        }
        if len(set(counts.values())) > 1:
            raise ValueError(
                f"with lengths: per_request the length lists must be equally long, got {counts}"
            )
        if counts and self.max_requests is None:
            self.max_requests = next(iter(counts.values()))
        if counts and self.max_requests is not None and self.max_requests > min(counts.values()):
            raise ValueError(
                f"max_requests ({self.max_requests}) exceeds the {min(counts.values())} "
                "per-request lengths given"
            )
        return self


Arrivals = Annotated[PoissonArrivals | TraceArrivals | ClosedArrivals, Field(discriminator="kind")]


class Batching(_Section):
    window_s: float = Field(0.0, ge=0)  # the longest wait before a pass (see wait_for)
    # "fill": from the oldest waiting block, until the pass is full (max_batch or rows);
    # "sessions": from when the server is free, until every session it is decoding has a
    # block in, or the pass is full (the specops gRPC target server's rule,
    # serving/distributed/scheduler.py).
    wait_for: Literal["fill", "sessions"] = "fill"
    mixed_prefill: bool = False  # prefills ride in decode passes (else: a pass of their own)


class Scenario(_Section):
    targets: list[TargetDevice] = Field(min_length=1)
    drafters: list[Drafter] = Field(min_length=1)
    mode: Mode = "distributed"
    router: RouterName = "jsq2"
    link: Link = Field(default_factory=lambda: Link())
    arrivals: Arrivals
    batching: Batching = Field(default_factory=lambda: Batching())
    duration_s: float = Field(gt=0)  # requests arrive during [0, duration_s)
    drain_s: float = Field(60.0, ge=0)  # then the run goes on this long for them to finish
    seed: int = 0
    slo_s: float = Field(10.0, gt=0)  # end-to-end latency SLO, for goodput
    queue_bin_s: float = Field(1.0, gt=0)  # queue depth over time is reported per bin

    @model_validator(mode="after")
    def _blocks_fit(self) -> Scenario:
        smallest = min(t.max_tokens_per_pass for t in self.targets)
        for i, drafter in enumerate(self.drafters):
            if drafter.k + 1 > smallest:
                raise ValueError(
                    f"drafters.{i}.k: a block of {drafter.k + 1} rows does not fit a pass of "
                    f"max_tokens_per_pass {smallest}"
                )
        return self


def parse_scenario(
    raw: object, *, source: str = "scenario", base_dir: Path | None = None
) -> Scenario:
    """Validate ``raw`` (a YAML mapping); a refusal names the dotted field path."""
    try:
        return Scenario.model_validate(raw, context={"base_dir": base_dir})
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in error.errors()
        )
        raise BadInputError(f"invalid simulation scenario {source}: {problems}") from None


def load_scenario(path: str | Path) -> Scenario:
    """Load and validate a scenario YAML; profile paths are relative to its folder."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise BadInputError(f"cannot read simulation scenario {str(path)!r}: {error}") from None
    return parse_scenario(raw, source=repr(str(path)), base_dir=path.parent)
