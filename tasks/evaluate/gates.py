"""Promotion gates: decide, from one interleaved evaluation, whether a challenger may
displace the champion on a hardware target (``configs/gates.yaml``).

Every check is reported with the measured values and the threshold, passed or not, so a
refusal says exactly why. Losslessness is mandatory and not configurable.

When the evaluation held out collected traffic (``by_source["traffic"]``, see
:mod:`tasks.evaluate.evaluate`), speed and acceptance are judged on that traffic, the one
that drifted, and a separate check guards the built-in workloads against forgetting; without
it they are judged on every prompt pooled.

Speed is modelled: each contender's recorded checks priced with the target's fixed verify
curve and its own profiled drafting cost (:mod:`tasks.evaluate.modelled`), which load on the
machine cannot flip; and the wall clock, timed in rounds, must agree that the challenger is
not slower: the bootstrap interval of its per-prompt speed ratio over the champion's (plain
decoding's, with no champion) may not lie wholly below 1.0 (:mod:`tasks.evaluate.interval`).
A ``speed_profile`` (a fixed curve and drafting cost) prices every contender alike instead,
so the same evaluation gets the same decision on any machine (:mod:`tasks.evaluate.priced`).
Why these rules, and the studies behind them: docs/loop.md, "Evaluation and gates".

:func:`judged_report` gives the report the gates judge; :class:`GateResult` says which
speed decided.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from serving.errors import BadInputError
from serving.paths import CONFIG_DIR
from tasks.evaluate.interval import wall_clock_interval
from tasks.evaluate.modelled import modelled_report
from tasks.evaluate.priced import Pricing, priced_report
from tasks.evaluate.report import (
    REFERENCE,
    TRAFFIC,
    ContenderResult,
    EvaluationReport,
    Group,
    source_of,
)

GATES_CONFIG = CONFIG_DIR / "gates.yaml"

# Settings the gates no longer take. Each one's only product value (what the gates always
# do) is still read and ignored; a value that only reproduced a study is refused, naming
# where the study now takes it.
RETIRED_SETTINGS: dict[str, tuple[str, dict[str, str]]] = {
    "speed": (
        "modelled",
        {
            "measured": "the gates always decide on modelled speed; judging by measured "
            "speed reproduces a study: `python -m benchmarks.gate_stability --speed measured`"
        },
    ),
    "modelled_curve": (
        "profiled",
        {
            "evaluated": "the gates always price modelled speed with the target's fixed "
            "(profiled) verify curve; the evaluation's own curve reproduces a study: "
            "`python -m benchmarks.gate_stability --modelled-curve evaluated` (and "
            "`python -m benchmarks.modelled_speed`, which reports both curves)"
        },
    ),
}
RETIRED = "retired_gate_setting"  # the pydantic error type of a refused retired setting


class SpeedProfile(BaseModel):
    """A fixed cost profile that prices speed (see :mod:`tasks.evaluate.priced`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # A target pass over n tokens, relative to n = 1 (n = 1, 2, ...); None: the hardware
    # target's measured verify_curve (configs/hardware.yaml).
    verify_curve: list[float] | None = Field(None, min_length=1)
    draft_cost: float = Field(0.0, ge=0.0)  # one drafted token, in one-token target passes

    def pricing(self, hardware: str) -> Pricing:
        """The profile on ``hardware``: its own curve, else that target's measured one."""
        from serving.hardware import hardware_target

        curve = self.verify_curve or hardware_target(hardware).verify_curve
        if not curve:
            raise BadInputError(
                f"the gates' speed_profile has no verify_curve and hardware target "
                f"{hardware!r} has none measured: give the profile one"
            )
        return Pricing(curve, self.draft_cost)


class GateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_prompts: int = Field(4, ge=1)
    min_speedup_gain: float = Field(0.03, ge=0.0)
    max_mean_accepted_length_drop: float = Field(0.05, ge=0.0)
    max_workload_slowdown: float = Field(0.10, ge=0.0, le=1.0)
    speed_profile: SpeedProfile | None = None  # set: this fixed profile prices every speed
    # The wall clock's bootstrap interval (of the challenger's per-prompt speed ratio) at
    # this confidence may not lie wholly below 1.0; 0 turns the check off.
    wall_clock_confidence: float = Field(0.95, ge=0.0, lt=1.0)
    # Timed rounds over the prompts (the interval reads every one); at least two for it.
    wall_clock_rounds: int = Field(2, ge=1, le=20)
    # The pre-gate (tasks/evaluate/pregate.py): a challenger whose predicted modelled
    # speedup is more than this far below the champion's is not timed; None: time every one.
    pregate_margin: float | None = Field(0.10, ge=0.0, lt=1.0)

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, data: Any) -> Any:
        """``data`` without the retired settings that say what the gates do anyway
        (:data:`RETIRED_SETTINGS`); any other value of one is refused with where it went."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for key, (kept, moved) in RETIRED_SETTINGS.items():
            if key not in data:
                continue
            value = data.pop(key)
            if value == kept:
                continue
            where = moved.get(str(value), f"only {kept!r} is still read, and it changes nothing")
            raise PydanticCustomError(
                RETIRED,
                "`{key}: {value}` is no longer a gates setting: {where}; remove the key",
                {"key": key, "value": value, "where": where},
            )
        return data

    @property
    def decided_by(self) -> str:
        return "fixed speed profile" if self.speed_profile is not None else "modelled speed"


def load_gates(path: str | Path = GATES_CONFIG) -> GateConfig:
    """The gates' settings in ``path``; :class:`BadInputError` naming the file and what is
    wrong (a retired setting: its key, its value and where it moved)."""
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        return GateConfig.model_validate(raw)
    except ValidationError as error:
        retired = [e["msg"] for e in error.errors() if e["type"] == RETIRED]
        detail = "; ".join(retired) if retired else str(error)
        raise BadInputError(f"invalid gates config {str(path)!r}: {detail}") from None
    except (OSError, yaml.YAMLError) as error:
        raise BadInputError(f"invalid gates config {str(path)!r}: {error}") from None


class Check(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    passed: bool
    detail: str


class GateResult(BaseModel):
    """Every check with its measured values and threshold, and the verdict (kept with the
    promotion in the registry and in the flow results)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    passed: bool
    reason: str
    checks: list[Check]
    decided_by: str = "measured speed"  # which speed the speed checks read (GateConfig)

    @classmethod
    def of(cls, checks: list[Check], decided_by: str = "measured speed") -> GateResult:
        failed = [c for c in checks if not c.passed]
        if not failed:
            reason = f"all gates passed ({decided_by}): " + "; ".join(c.detail for c in checks)
        else:
            reason = f"refused ({decided_by}): " + "; ".join(
                f"{c.name}: {c.detail}" for c in failed
            )
        return cls(passed=not failed, reason=reason, checks=checks, decided_by=decided_by)


def judged_report(report: EvaluationReport, config: GateConfig | None = None) -> EvaluationReport:
    """The report the gates judge and a winner is chosen from: ``report`` with every
    speedup modelled (priced with the target's fixed verify curve), or priced by the
    config's ``speed_profile``; its measured tokens/s kept as they were."""
    config = config or load_gates()
    if config.speed_profile is not None:
        return priced_report(report, config.speed_profile.pricing(report.hardware))
    return modelled_report(report)


def gate(
    report: EvaluationReport,
    *,
    challenger: str = "challenger",
    champion: str = "champion",
    config: GateConfig | None = None,
    check_acceptance: bool = True,
) -> GateResult:
    """Apply the gates to an evaluation report (:func:`tasks.evaluate.evaluate.evaluate`),
    as it is: price it first with :func:`judged_report` where the config says so.

    ``check_acceptance=False`` drops the acceptance-regression check: for a challenger that
    changes how far the same draft drafts (an acceptance predictor), fewer tokens per pass
    can be the faster choice, and speed (with losslessness) is what decides."""
    config = config or load_gates()
    results = report.results
    if challenger not in results:
        raise BadInputError(f"the report has no contender {challenger!r}: {sorted(results)}")
    overall = new = results[challenger]
    old: ContenderResult | None = results.get(champion)
    traffic, builtin = report.by_source.get("traffic"), report.by_source.get("builtin")
    on = " on held-out traffic" if traffic else ""
    if traffic:  # judge speed and acceptance where the traffic drifted
        new, old = traffic[challenger], traffic.get(champion)
    checks = [
        Check(
            name="lossless",
            passed=overall.lossless,
            detail="greedy output equals plain decoding on every prompt"
            if overall.lossless
            else f"output differs from plain decoding on {overall.mismatched_prompts}",
        ),
        Check(
            name="enough prompts",
            passed=report.prompts >= config.min_prompts,
            detail=f"{report.prompts} prompts (need {config.min_prompts})",
        ),
    ]
    new_speed = new.speedup
    if old is None:
        # No champion yet: the challenger must at least beat plain decoding.
        checks.append(
            Check(
                name=f"faster than plain decoding{on}",
                passed=new_speed is not None and new_speed >= 1.0 + config.min_speedup_gain,
                detail=f"speedup {new_speed} (need >= {1.0 + config.min_speedup_gain:.2f})",
            )
        )
        checks += _wall_clock(report, challenger, REFERENCE, config, bool(traffic))
        return GateResult.of(checks, config.decided_by)
    old_speed = old.speedup
    wanted = None if old_speed is None else old_speed * (1.0 + config.min_speedup_gain)
    checks.append(
        Check(
            name=f"faster than the champion{on}",
            passed=new_speed is not None and wanted is not None and new_speed >= wanted,
            detail=f"speedup {new_speed:.3f} vs champion {old_speed:.3f} (need >= {wanted:.3f})"
            if new_speed is not None and wanted is not None and old_speed is not None
            else f"speedup {new_speed} vs champion {old_speed}",
        )
    )
    new_len = new.mean_accepted_length or 1.0
    old_len = old.mean_accepted_length or 1.0
    if check_acceptance:
        checks.append(
            Check(
                name=f"no acceptance regression{on}",
                passed=new_len >= old_len - config.max_mean_accepted_length_drop,
                detail=f"mean accepted length {new_len:.3f} vs champion {old_len:.3f} "
                f"(may drop at most {config.max_mean_accepted_length_drop})",
            )
        )
    if traffic and builtin and champion in builtin:
        checks.append(_no_forgetting(builtin, challenger, champion, config))
    checks.append(_no_workload_slowdown(report, challenger, champion, config))
    checks += _wall_clock(report, challenger, champion, config, bool(traffic))
    return GateResult.of(checks, config.decided_by)


def _no_forgetting(builtin: Group, challenger: str, champion: str, config: GateConfig) -> Check:
    """The challenger's speedup on the built-in workloads, at most ``max_workload_slowdown``
    below the champion's (judged where held-out traffic decides the speed checks)."""
    a, b = builtin[challenger].speedup, builtin[champion].speedup
    kept = a is not None and b is not None and a >= b * (1.0 - config.max_workload_slowdown)
    return Check(
        name="no forgetting on built-in workloads",
        passed=kept,
        detail=f"built-in speedup {a} vs champion {b} (may be at most "
        f"{config.max_workload_slowdown:.0%} lower)"
        if a is None or b is None
        else f"built-in speedup {a:.3f} vs champion {b:.3f} (may be at most "
        f"{config.max_workload_slowdown:.0%} lower)",
    )


def _no_workload_slowdown(
    report: EvaluationReport, challenger: str, champion: str, config: GateConfig
) -> Check:
    """No workload on which the challenger is slower than the champion by more than
    ``max_workload_slowdown``."""
    slow = []
    for workload, by_name in report.by_workload.items():
        mine, theirs = by_name.get(challenger), by_name.get(champion)
        a = None if mine is None else mine.speedup
        b = None if theirs is None else theirs.speedup
        if a is not None and b is not None and a < b * (1.0 - config.max_workload_slowdown):
            slow.append(f"{workload} {a:.3f} vs {b:.3f}")
    return Check(
        name="no workload slowdown",
        passed=not slow,
        detail="no workload slower than the champion by more than "
        f"{config.max_workload_slowdown:.0%}" + (f": {', '.join(slow)}" if slow else ""),
    )


def _wall_clock(
    report: EvaluationReport, challenger: str, baseline: str, config: GateConfig, traffic: bool
) -> list[Check]:
    """The wall clock's say (see the module docstring): none when the check is off."""
    if config.wall_clock_confidence == 0:
        return []
    over = "plain decoding" if baseline == REFERENCE else "the champion"
    name = f"wall clock not slower than {over}" + (" on held-out traffic" if traffic else "")
    try:
        interval = wall_clock_interval(
            report,
            challenger,
            baseline,
            keep=(lambda w: source_of(w) == TRAFFIC) if traffic else (lambda w: True),
            confidence=config.wall_clock_confidence,
        )
    except BadInputError as error:
        return [Check(name=name, passed=False, detail=str(error))]
    return [
        Check(
            name=name,
            passed=interval.high >= 1.0,
            detail=interval.describe(challenger, over) + f" over {report.rounds} rounds",
        )
    ]
