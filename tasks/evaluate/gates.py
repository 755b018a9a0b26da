"""Promotion gates: decide, from one interleaved evaluation, whether a challenger may
displace the champion on a hardware target (``configs/gates.yaml``).

Every check is reported with the measured values and the threshold, passed or not, so a
refusal says exactly why. Losslessness is mandatory and not configurable.

When the evaluation held out collected traffic (``by_source["traffic"]``, see
:mod:`tasks.evaluate.evaluate`), speed and acceptance are judged on that traffic, the one
that drifted, and a separate check guards the built-in workloads against forgetting; without
it they are judged on every prompt pooled.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serving.errors import BadInputError
from serving.paths import CONFIG_DIR

GATES_CONFIG = CONFIG_DIR / "gates.yaml"


class GateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_prompts: int = Field(4, ge=1)
    min_speedup_gain: float = Field(0.03, ge=0.0)
    max_mean_accepted_length_drop: float = Field(0.05, ge=0.0)
    max_workload_slowdown: float = Field(0.10, ge=0.0, le=1.0)


def load_gates(path: str | Path = GATES_CONFIG) -> GateConfig:
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        return GateConfig.model_validate(raw)
    except (OSError, yaml.YAMLError, ValidationError) as error:
        raise BadInputError(f"invalid gates config {str(path)!r}: {error}") from None


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class GateResult:
    passed: bool
    checks: list[Check]

    @property
    def reason(self) -> str:
        failed = [c for c in self.checks if not c.passed]
        if not failed:
            return "all gates passed: " + "; ".join(c.detail for c in self.checks)
        return "refused: " + "; ".join(f"{c.name}: {c.detail}" for c in failed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "reason": self.reason,
            "checks": [asdict(c) for c in self.checks],
        }


def _value(results: dict[str, Any], key: str) -> float | None:
    value = results.get(key)
    return None if value is None else float(value)


def gate(
    report: dict[str, Any],
    *,
    challenger: str = "challenger",
    champion: str = "champion",
    config: GateConfig | None = None,
    check_acceptance: bool = True,
) -> GateResult:
    """Apply the gates to an evaluation report (:func:`tasks.evaluate.evaluate.evaluate`).

    ``check_acceptance=False`` drops the acceptance-regression check: for a challenger that
    changes how far the same draft drafts (an acceptance predictor), fewer tokens per pass
    can be the faster choice, and speed (with losslessness) is what decides."""
    config = config or load_gates()
    results = report["results"]
    if challenger not in results:
        raise BadInputError(f"the report has no contender {challenger!r}: {sorted(results)}")
    overall = new = results[challenger]
    old = results.get(champion)
    by_source = report.get("by_source") or {}
    traffic, builtin = by_source.get("traffic"), by_source.get("builtin")
    on = " on held-out traffic" if traffic else ""
    if traffic:  # judge speed and acceptance where the traffic drifted
        new, old = traffic[challenger], traffic.get(champion)
    checks = [
        Check(
            "lossless",
            bool(overall["lossless"]),
            "greedy output equals plain decoding on every prompt"
            if overall["lossless"]
            else f"output differs from plain decoding on {overall['mismatched_prompts']}",
        ),
        Check(
            "enough prompts",
            report["prompts"] >= config.min_prompts,
            f"{report['prompts']} prompts (need {config.min_prompts})",
        ),
    ]
    new_speed = _value(new, "speedup")
    if old is None:
        # No champion yet: the challenger must at least beat plain decoding.
        checks.append(
            Check(
                f"faster than plain decoding{on}",
                new_speed is not None and new_speed >= 1.0 + config.min_speedup_gain,
                f"speedup {new_speed} (need >= {1.0 + config.min_speedup_gain:.2f})",
            )
        )
        return GateResult(all(c.passed for c in checks), checks)
    old_speed = _value(old, "speedup")
    wanted = None if old_speed is None else old_speed * (1.0 + config.min_speedup_gain)
    checks.append(
        Check(
            f"faster than the champion{on}",
            new_speed is not None and wanted is not None and new_speed >= wanted,
            f"speedup {new_speed:.3f} vs champion {old_speed:.3f} (need >= {wanted:.3f})"
            if new_speed is not None and wanted is not None and old_speed is not None
            else f"speedup {new_speed} vs champion {old_speed}",
        )
    )
    new_len = _value(new, "mean_accepted_length") or 1.0
    old_len = _value(old, "mean_accepted_length") or 1.0
    if check_acceptance:
        checks.append(
            Check(
                f"no acceptance regression{on}",
                new_len >= old_len - config.max_mean_accepted_length_drop,
                f"mean accepted length {new_len:.3f} vs champion {old_len:.3f} "
                f"(may drop at most {config.max_mean_accepted_length_drop})",
            )
        )
    if traffic and builtin and champion in builtin:
        a, b = _value(builtin[challenger], "speedup"), _value(builtin[champion], "speedup")
        kept = a is not None and b is not None and a >= b * (1.0 - config.max_workload_slowdown)
        checks.append(
            Check(
                "no forgetting on built-in workloads",
                kept,
                f"built-in speedup {a} vs champion {b} (may be at most "
                f"{config.max_workload_slowdown:.0%} lower)"
                if a is None or b is None
                else f"built-in speedup {a:.3f} vs champion {b:.3f} (may be at most "
                f"{config.max_workload_slowdown:.0%} lower)",
            )
        )
    slow = []
    for workload, by_name in report.get("by_workload", {}).items():
        a, b = by_name.get(challenger, {}).get("speedup"), by_name.get(champion, {}).get("speedup")
        if a is not None and b is not None and a < b * (1.0 - config.max_workload_slowdown):
            slow.append(f"{workload} {a:.3f} vs {b:.3f}")
    checks.append(
        Check(
            "no workload slowdown",
            not slow,
            "no workload slower than the champion by more than "
            f"{config.max_workload_slowdown:.0%}" + (f": {', '.join(slow)}" if slow else ""),
        )
    )
    return GateResult(all(c.passed for c in checks), checks)
