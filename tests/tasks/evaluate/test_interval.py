"""The wall clock's interval: a bootstrap of the per-prompt speed ratio, and the gate
that refuses a challenger the clock says is slower."""

from __future__ import annotations

import pytest

from serving.errors import BadInputError
from tasks.evaluate.gates import GateConfig, gate
from tasks.evaluate.interval import wall_clock_interval
from tasks.evaluate.report import EvaluationReport, PromptRun
from tests.tasks.evaluate.test_gates import result

PROMPTS = 8


def _runs(seconds: list[float], workload: str = "grounded") -> list[PromptRun]:
    return [
        PromptRun(
            prompt_id=f"p{i}",
            workload=workload,
            seconds=s,
            stats={"generated_tokens": 24},
            steps=[[0, 0]] * 24,
            lossless=True,
            round_seconds=[s, s],
        )
        for i, s in enumerate(seconds)
    ]


def _report(challenger: list[float], champion: list[float], speedups=(1.4, 1.2)):
    group = {"plain": result(1.0, 1.0), "challenger": result(speedups[0]),
             "champion": result(speedups[1])}  # fmt: skip
    return EvaluationReport(
        hardware="cpu", prompts=PROMPTS, max_new_tokens=24,
        contenders={"challenger": "/c", "champion": "/d"}, results=group, by_workload={},
        per_prompt={"plain": _runs([1.0] * PROMPTS), "challenger": _runs(challenger),
                    "champion": _runs(champion)},
        rounds=2,
    )  # fmt: skip


NOISY = [0.8, 1.3, 0.9, 1.25, 0.85, 1.2, 0.95, 1.1]


def test_a_clearly_faster_challenger_has_an_interval_above_one():
    interval = wall_clock_interval(
        _report([0.5] * 4 + [0.55] * 4, [1.0] * 8), "challenger", "champion"
    )
    assert 1.0 < interval.low <= interval.ratio <= interval.high
    assert interval.prompts == PROMPTS and interval.confidence == 0.95


def test_the_interval_is_the_same_for_the_same_report():
    report = _report(NOISY, [1.0] * 8)
    first = wall_clock_interval(report, "challenger", "champion")
    assert wall_clock_interval(report, "challenger", "champion") == first
    assert first.low < 1.0 < first.high  # noise: the clock cannot tell


@pytest.mark.parametrize(
    ("challenger", "passes"),
    [(NOISY, True), ([1.3] * 4 + [1.35] * 4, False)],  # unsure, or surely slower
)
def test_the_gate_needs_the_interval_not_wholly_below_one(challenger, passes):
    # The modelled speedups say 1.4 against 1.2; the clock may be unsure, never contrary.
    config = GateConfig(min_prompts=4)
    outcome = gate(_report(challenger, [1.0] * 8), config=config)
    assert outcome.passed is passes, outcome.reason
    check = next(c for c in outcome.checks if c.name.startswith("wall clock"))
    assert "interval [" in check.detail and "over 2 rounds" in check.detail
    assert outcome.decided_by == "modelled speed" and "(modelled speed)" in outcome.reason
    off = gate(
        _report(challenger, [1.0] * 8), config=GateConfig(min_prompts=4, wall_clock_confidence=0)
    )
    assert off.passed and not any(c.name.startswith("wall clock") for c in off.checks)


def test_without_a_champion_the_clock_is_read_against_plain_decoding():
    report = _report([0.5] * 8, [1.0] * 8)
    report.results.pop("champion")
    outcome = gate(report, config=GateConfig(min_prompts=4))
    assert outcome.passed, outcome.reason
    assert any(c.name == "wall clock not slower than plain decoding" for c in outcome.checks)


def test_a_report_without_timings_is_refused_by_name():
    report = _report([1.0] * 8, [1.0] * 8).model_copy(update={"per_prompt": None})
    with pytest.raises(BadInputError, match="no per-prompt timings for 'challenger'"):
        wall_clock_interval(report, "challenger", "champion")
    outcome = gate(report, config=GateConfig(min_prompts=4))
    assert not outcome.passed and "no per-prompt timings" in outcome.reason
