"""Modelled speed: each contender's checks priced with the evaluation's verify curve and
its own profiled drafting cost; the clock's seconds do not enter it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from serving.errors import BadInputError
from tasks.evaluate.gates import GateConfig, judged_report
from tasks.evaluate.modelled import modelled_report
from tests.tasks.evaluate.test_priced import evaluation


def _modelled_input(costs, curve=(1.0, 1.0, 1.0, 1.0, 1.0)):
    return evaluation().model_copy(update={"verify_curve": list(curve), "draft_costs": costs})


def test_each_contender_pays_its_own_drafting_cost():
    free = modelled_report(_modelled_input({"challenger": 0.0}))
    # Flat curve, free drafts: plain 24 passes, the draft 4 + 12 = 16, for 24 tokens each.
    assert free.results["challenger"].speedup == pytest.approx(24 / 16)
    dear = modelled_report(_modelled_input({"challenger": 0.1}))
    # 16 checks of 4 drafts each (p1: 2 of 4, 2 of 0; p2: 12 of 4): 56 drafted tokens.
    assert dear.results["challenger"].speedup == pytest.approx(24 / (16 + 0.1 * 56))
    assert (
        dear.results["challenger"].tokens_per_s == evaluation().results["challenger"].tokens_per_s
    )


def test_the_seconds_do_not_enter_it():
    report = _modelled_input({"challenger": 0.05})
    slower = report.model_copy(
        update={
            "per_prompt": {
                name: [run.model_copy(update={"seconds": run.seconds * 7}) for run in runs]
                for name, runs in (report.per_prompt or {}).items()
            }
        }
    )
    assert modelled_report(slower) == modelled_report(report).model_copy(
        update={"per_prompt": slower.per_prompt}
    )


def test_what_is_missing_is_named_with_the_remedy():
    with pytest.raises(
        BadInputError, match=r"no profiled drafting cost for \['challenger'\].*evaluate again"
    ):
        modelled_report(_modelled_input({}))
    with pytest.raises(BadInputError, match=r"recorded no verify curve.*speed_profile"):
        modelled_report(_modelled_input({"challenger": 0.0}, curve=()))


def test_the_gates_always_judge_modelled_speed():
    report = _modelled_input({"challenger": 0.0})  # measured 0.5x, modelled 1.5x
    assert judged_report(report, GateConfig()).results["challenger"].speedup == pytest.approx(1.5)
    assert GateConfig(speed="modelled", modelled_curve="profiled") == GateConfig()
    with pytest.raises(ValidationError, match=r"speed: measured.*benchmarks\.gate_stability"):
        GateConfig(speed="measured")


def test_the_fixed_curve_prices_it_unless_the_evaluated_one_is_asked_for():
    # The timed passes found a five-token pass twice a one-token one; the profile, flat.
    report = _modelled_input({"challenger": 0.0}).model_copy(
        update={"evaluated_curve": [1.0, 1.0, 1.0, 1.0, 2.0], "evaluated_passes": [9] * 5}
    )
    assert modelled_report(report).results["challenger"].speedup == pytest.approx(1.5)
    assert judged_report(report, GateConfig()).results["challenger"].speedup == pytest.approx(1.5)
    # 14 checks of 4 drafts at 2 passes, 2 of none at 1: 30 passes against plain's 24.
    assert modelled_report(report, "evaluated").results["challenger"].speedup == pytest.approx(
        24 / 30
    )
    # An older report, or one with too few timed passes: the fixed curve prices it.
    older = report.model_copy(update={"evaluated_curve": [], "evaluated_passes": []})
    assert modelled_report(older, "evaluated").results["challenger"].speedup == pytest.approx(1.5)


def _with_timings(report, prefill_s: float, total_s: float):
    """``report`` with plain decoding's prefill and total seconds on every prompt."""
    rows = dict(report.per_prompt or {})
    rows["plain"] = [
        run.model_copy(update={"stats": {**run.stats, "prefill_s": prefill_s, "total_s": total_s}})
        for run in rows["plain"]
    ]
    return report.model_copy(update={"per_prompt": rows})


def test_each_prompts_prefill_is_priced_in_plain_decodings_own_steps():
    # Plain: 12 checks a prompt in 0.6 s after a 0.3 s prefill: 0.05 s a step, so the
    # prefill costs 6 steps on each prompt, for plain decoding and the draft alike.
    report = _with_timings(_modelled_input({"challenger": 0.0}), prefill_s=0.3, total_s=0.9)
    modelled = modelled_report(report)
    assert modelled.results["challenger"].speedup == pytest.approx((24 + 12) / (16 + 12))
    # p1 (traffic:humaneval): the draft makes its 12 tokens in 4 checks; p2 in 12.
    by = modelled.by_workload
    assert by["traffic:humaneval"]["challenger"].speedup == pytest.approx((12 + 6) / (4 + 6))
    assert by["grounded"]["challenger"].speedup == pytest.approx((12 + 6) / (12 + 6))
    # Where the seconds cannot tell it (no checks after the prefill), it is left unpriced.
    untold = _with_timings(_modelled_input({"challenger": 0.0}), prefill_s=0.3, total_s=0.3)
    assert modelled_report(untold).results["challenger"].speedup == pytest.approx(24 / 16)
