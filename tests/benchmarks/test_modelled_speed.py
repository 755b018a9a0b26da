"""The modelled-speed study compares each contender's modelled speedup with the median of
its rounds' measured ones, per workload."""

from __future__ import annotations

import pytest

from benchmarks.modelled_speed import compare, measured_by_round
from tasks.evaluate.report import EvaluationReport, PromptRun
from tests.tasks.evaluate.test_gates import result


def _run(prompt: str, steps: list[list[int]], rounds: list[float]) -> PromptRun:
    tokens = sum(accepted + 1 for _, accepted in steps)
    return PromptRun(
        prompt_id=prompt, workload="grounded", seconds=sum(rounds) / len(rounds),
        stats={"generated_tokens": tokens}, steps=steps, lossless=True, round_seconds=rounds,
    )  # fmt: skip


def test_each_round_is_measured_against_plain_decoding_in_that_round():
    plain = [_run("p", [[0, 0]] * 12, [1.2, 1.0, 1.5])]
    lookup = [_run("p", [[3, 3], [3, 3], [3, 3]], [0.4, 0.5, 0.5])]  # 12 tokens, 3 checks
    group = {"plain": result(1.0, 1.0), "0-pld:3": result(2.0, 4.0)}
    report = EvaluationReport(
        hardware="cpu", prompts=1, max_new_tokens=12, contenders={"0-pld:3": "/p"},
        results=group, by_workload={"grounded": group},
        per_prompt={"plain": plain, "0-pld:3": lookup}, rounds=3,
        verify_curve=[1.0, 1.0, 1.0, 1.0], draft_costs={"0-pld:3": 0.0},
    )  # fmt: skip
    assert measured_by_round(report, "0-pld:3", "grounded") == pytest.approx([3.0, 2.0, 3.0])
    (row,) = compare(report)
    # Modelled: flat curve, free drafts: 12 tokens in 3 passes, 4x; measured median 3x.
    assert row["modelled"] == pytest.approx(4.0) and row["measured_median"] == pytest.approx(3.0)
    assert row["error"] == pytest.approx(4.0 / 3.0 - 1.0)
    assert row["same_side_of_1"] and row["same_side_of_champion"]
