"""Speed priced by a fixed cost profile: what each contender accepted, charged by the
profile, decides; the clock does not."""

from __future__ import annotations

import pytest

from serving.errors import BadInputError
from tasks.evaluate.gates import GateConfig, SpeedProfile, gate, judged_report, load_gates
from tasks.evaluate.priced import Pricing, priced_backend_speedups, priced_report
from tasks.evaluate.report import EvaluationReport, PromptRun
from tests.tasks.evaluate.test_gates import result


def run(prompt: str, workload: str, steps: list[list[int]]) -> PromptRun:
    """A generation whose checks are ``steps``; each emits its accepted drafts plus one."""
    tokens = sum(accepted + 1 for _, accepted in steps)
    return PromptRun(
        prompt_id=prompt,
        workload=workload,
        seconds=1.0,
        stats={"generated_tokens": tokens},
        steps=steps,
        lossless=True,
    )


PLAIN = {"p1": [[0, 0]] * 12, "p2": [[0, 0]] * 12}  # 12 tokens each, one pass per token
# Four drafts per check: all kept on p1 (12 tokens in 3 checks), none on p2 (12 checks).
LOOKUP = {"p1": [[4, 4], [4, 4], [0, 0], [0, 0]], "p2": [[4, 0]] * 12}
WORKLOADS = {"p1": "traffic:humaneval", "p2": "grounded"}


def evaluation(measured: float = 0.5) -> EvaluationReport:
    """An evaluation whose measured speedups say the draft is slower (``measured``)."""
    rows = {
        name: [run(p, WORKLOADS[p], steps) for p, steps in checks.items()]
        for name, checks in (("plain", PLAIN), ("challenger", LOOKUP))
    }
    group = {"plain": result(1.0, 1.0), "challenger": result(measured, 2.0)}
    return EvaluationReport(
        hardware="cpu",
        prompts=2,
        max_new_tokens=12,
        contenders={"challenger": "/packages/pld"},
        results=group,
        by_workload={"grounded": group, "traffic:humaneval": group},
        by_source={"builtin": group, "traffic": group},
        per_prompt=rows,
    )


def test_a_pass_costs_its_curve_and_each_draft_its_cost():
    pricing = Pricing([2.0, 2.0, 3.0], draft_cost=0.25)  # normalised: 1, 1, 1.5, then +0.25/n
    assert pricing.checks({0: 3}) == 3.0
    assert pricing.checks({1: 2}) == pytest.approx(2 * (1.0 + 0.25))
    assert pricing.checks({2: 1}) == pytest.approx(1.5 + 0.5)
    assert pricing.checks({4: 1}) == pytest.approx(1.5 + 2 * 0.25 + 1.0)  # past the curve
    with pytest.raises(BadInputError, match="draft_cost"):
        Pricing([1.0], draft_cost=-1.0)


def test_every_speedup_is_priced_from_the_checks_and_the_clock_is_kept():
    report = priced_report(evaluation(), Pricing([1.0] * 5, draft_cost=0.0))
    # Flat curve, free drafts: plain 24 passes, the draft 4 + 12 = 16, for 24 tokens each.
    assert report.results["challenger"].speedup == pytest.approx(24 / 16)
    assert report.results["plain"].speedup == pytest.approx(1.0)
    assert report.by_workload["traffic:humaneval"]["challenger"].speedup == pytest.approx(12 / 4)
    assert report.by_workload["grounded"]["challenger"].speedup == pytest.approx(1.0)
    assert report.by_source["traffic"]["challenger"].speedup == pytest.approx(12 / 4)
    assert report.by_source["builtin"]["challenger"].speedup == pytest.approx(1.0)
    assert (
        report.results["challenger"].tokens_per_s == evaluation().results["challenger"].tokens_per_s
    )
    # Drafting that costs: each of the 56 drafts at 0.25 of a pass.
    dear = priced_report(evaluation(), Pricing([1.0] * 5, draft_cost=0.25))
    assert dear.results["challenger"].speedup == pytest.approx(24 / (16 + 56 * 0.25))


def test_the_gates_judge_the_priced_report_whatever_the_clock_said():
    flat = SpeedProfile(verify_curve=[1.0] * 5)
    config = GateConfig(min_prompts=2, speed_profile=flat)
    measured = evaluation(measured=0.5)  # the machine was busy: slower by the clock
    assert not gate(measured, config=config).passed  # as measured, it would be refused
    judged = judged_report(measured, config)
    outcome = gate(judged, config=config)
    assert outcome.passed, outcome.reason  # priced: 12 / 4 on the held-out traffic
    assert "speedup 3.0 (need >= 1.03)" in outcome.reason
    assert outcome.decided_by == "fixed speed profile"


def test_the_profile_defaults_to_the_targets_measured_curve():
    from serving.hardware import hardware_target

    measured = hardware_target("cpu").verify_curve
    assert SpeedProfile().pricing("cpu").curve[1] == pytest.approx(measured[1] / measured[0])
    with pytest.raises(BadInputError, match="'cpu-vllm' has none measured"):
        SpeedProfile().pricing("cpu-vllm")
    shipped = load_gates()  # the shipped gates model speed from each evaluation's own profile
    assert shipped.speed_profile is None and shipped.decided_by == "modelled speed"


def test_a_report_without_its_checks_cannot_be_priced():
    report = evaluation().model_copy(update={"per_prompt": None})
    with pytest.raises(BadInputError, match="no per-prompt rows"):
        priced_report(report, Pricing([1.0], draft_cost=0.0))


def test_a_backends_checks_are_priced_from_the_positions_they_reached():
    """Four drafts per check (k = 4): 3 checks reached every position, 2 proposed none."""
    drafted = {"tokens": 20, "checks": 5, "reached_by_position": [3, 3, 3, 3]}
    plain = {"tokens": 20, "checks": 20, "reached_by_position": []}
    report = {
        "results": {"plain": {}, "pld": {}},
        "per_prompt": {"pld": [drafted], "plain (pld)": [plain]},
    }
    flat = Pricing([1.0] * 5, draft_cost=0.5)
    # 2 plain checks + 3 checks of 4 drafts (1 pass + 2.0 of drafting each) = 11 passes.
    assert priced_backend_speedups(report, flat) == {"pld": pytest.approx(20 / 11)}
    # A backend that counts no checks for plain decoding: one pass per token.
    report["per_prompt"]["plain (pld)"] = [{"tokens": 20, "checks": 0}]
    assert priced_backend_speedups(report, flat) == {"pld": pytest.approx(20 / 11)}
