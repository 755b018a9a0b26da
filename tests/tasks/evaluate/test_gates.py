import pytest

from serving.errors import BadInputError
from tasks.evaluate.gates import GATES_CONFIG, GateConfig, gate, load_gates
from tasks.evaluate.report import ContenderResult, EvaluationReport

# The speed checks on their own (the wall clock's interval: tests/tasks/evaluate/test_interval.py).
CONFIG = GateConfig(
    min_prompts=4, min_speedup_gain=0.03, max_mean_accepted_length_drop=0.05,
    max_workload_slowdown=0.10, wall_clock_confidence=0,
)  # fmt: skip


def result(speedup, length=1.5, lossless=True) -> ContenderResult:
    """A contender's numbers: what the gates read, the rest as evaluate() would give them."""
    return ContenderResult(
        requests=8,
        generated_tokens=96,
        checks=round(96 / length),
        draft_tokens=96,
        accepted_tokens=48,
        acceptance_rate=0.5,
        mean_accepted_length=length,
        total_s=1.0,
        tokens_per_s=96.0 * speedup,
        speedup=speedup,
        acceptance_by_position=[0.5],
        lossless=lossless,
        mismatched_prompts=[] if lossless else ["p3"],
    )


def report(challenger, champion=None, prompts=8, by_workload=None) -> EvaluationReport:
    results = {"plain": result(1.0, 1.0), "challenger": challenger}
    if champion is not None:
        results["champion"] = champion
    return EvaluationReport(
        hardware="cpu",
        prompts=prompts,
        max_new_tokens=12,
        contenders={name: f"/packages/{name}" for name in results if name != "plain"},
        results=results,
        by_workload=by_workload or {},
    )


def test_a_faster_lossless_challenger_passes():
    outcome = gate(report(result(1.40), result(1.20)), config=CONFIG)
    assert outcome.passed, outcome.reason
    assert outcome.reason.startswith("all gates passed")


def test_a_challenger_that_breaks_losslessness_is_refused_whatever_its_speed():
    outcome = gate(report(result(9.0, 5.0, lossless=False), result(1.2)), config=CONFIG)
    assert not outcome.passed
    assert "lossless" in outcome.reason and "p3" in outcome.reason


def test_a_slower_challenger_is_refused():
    outcome = gate(report(result(0.9, 1.0), result(1.2)), config=CONFIG)
    assert not outcome.passed and "faster than the champion" in outcome.reason


def test_a_marginal_gain_is_not_enough():
    assert not gate(report(result(1.21), result(1.20)), config=CONFIG).passed


def test_an_acceptance_regression_is_refused():
    outcome = gate(report(result(1.5, 1.3), result(1.2, 1.6)), config=CONFIG)
    assert not outcome.passed and "no acceptance regression" in outcome.reason


def test_a_workload_slowdown_is_refused():
    workloads = {
        "humaneval": {"challenger": result(2.0), "champion": result(1.2)},
        "sharegpt": {"challenger": result(0.9), "champion": result(1.1)},
    }
    outcome = gate(report(result(1.5), result(1.2), by_workload=workloads), config=CONFIG)
    assert not outcome.passed and "sharegpt" in outcome.reason


def test_too_few_prompts_decide_nothing():
    assert not gate(report(result(2.0), result(1.0), prompts=2), config=CONFIG).passed


def test_without_a_champion_the_challenger_must_beat_plain_decoding():
    assert gate(report(result(1.2)), config=CONFIG).passed
    assert not gate(report(result(1.01)), config=CONFIG).passed


def test_a_missing_challenger_and_a_bad_config_are_errors(tmp_path):
    with pytest.raises(BadInputError, match="no contender 'nope'"):
        gate(report(result(1.2)), challenger="nope", config=CONFIG)
    bad = tmp_path / "gates.yaml"
    bad.write_text("min_speedup_gain: -1\n")
    with pytest.raises(BadInputError, match="min_speedup_gain"):
        load_gates(bad)
    bad.write_text("wall_clock_rounds: 0\n")
    with pytest.raises(BadInputError, match="wall_clock_rounds"):
        load_gates(bad)


def test_the_shipped_config_loads():
    shipped = load_gates()
    assert shipped.min_prompts >= 1
    assert shipped.wall_clock_rounds >= 2  # the interval needs more than one round


def test_the_retired_speed_settings_still_read_at_their_product_values(tmp_path):
    # A gates.yaml written before `speed` and `modelled_curve` left the product: the values
    # it always had load, and decide as the gates do now.
    shipped = load_gates()
    old = tmp_path / "gates.yaml"
    old.write_text(GATES_CONFIG.read_text() + "speed: modelled\nmodelled_curve: profiled\n")
    assert load_gates(old) == shipped
    assert load_gates(old).decided_by == "modelled speed"


@pytest.mark.parametrize(
    ("setting", "moved"),
    [
        ("speed: measured", "python -m benchmarks.gate_stability --speed measured"),
        (
            "modelled_curve: evaluated",
            "python -m benchmarks.gate_stability --modelled-curve evaluated",
        ),
        ("speed: fast", "only 'modelled' is still read"),
    ],
)
def test_a_study_only_speed_setting_is_refused_saying_where_it_moved(tmp_path, setting, moved):
    path = tmp_path / "gates.yaml"
    path.write_text(GATES_CONFIG.read_text() + setting + "\n")
    with pytest.raises(BadInputError) as refused:
        load_gates(path)
    message = str(refused.value)
    assert message.startswith(f"invalid gates config {str(path)!r}: `{setting}` is no longer")
    assert moved in message and "remove the key" in message
    assert "validation error" not in message  # the one reason, not pydantic's dump


def with_sources(overall_new, overall_old, traffic_new, traffic_old, builtin_new, builtin_old):
    by_source = {
        "traffic": {"plain": result(1.0, 1.0), "challenger": traffic_new, "champion": traffic_old},
        "builtin": {
            "plain": result(1.0, 1.0), "challenger": builtin_new, "champion": builtin_old,
        },
    }  # fmt: skip
    return report(overall_new, overall_old).model_copy(update={"by_source": by_source})


def test_with_held_out_traffic_speed_is_judged_on_the_traffic_that_drifted():
    # Pooled, the challenger is no faster; on the held-out traffic it is, and it keeps the
    # built-in workloads' speed: it passes, and the reason says where it was measured.
    outcome = gate(
        with_sources(result(1.2), result(1.2), result(1.6), result(1.1), result(1.15), result(1.2)),
        config=CONFIG,
    )
    assert outcome.passed, outcome.reason
    assert "faster than the champion on held-out traffic" in [c.name for c in outcome.checks]
    assert "no forgetting on built-in workloads" in [c.name for c in outcome.checks]


def test_forgetting_the_built_in_workloads_is_refused_even_when_the_traffic_gains():
    outcome = gate(
        with_sources(result(1.4), result(1.2), result(2.0), result(1.1), result(0.9), result(1.3)),
        config=CONFIG,
    )
    assert not outcome.passed and "no forgetting on built-in workloads" in outcome.reason


def test_losslessness_is_judged_on_every_prompt_not_only_the_traffic():
    outcome = gate(
        with_sources(
            result(1.4, lossless=False), result(1.2), result(2.0), result(1.1), result(1.3),
            result(1.2),
        ),
        config=CONFIG,
    )  # fmt: skip
    assert not outcome.passed and "p3" in outcome.reason
