from registry.acceptance import evaluated_acceptance
from tests.tasks.loop.test_triggers import TAGS


def test_the_held_out_traffic_then_the_builtin_workload_then_the_whole_evaluation():
    assert evaluated_acceptance(TAGS, "cpu", "humaneval") == (0.3, "its held-out traffic")
    assert evaluated_acceptance(TAGS, "cpu", "grounded") == (0.9, "built-in grounded")
    assert evaluated_acceptance(TAGS, "cpu", "sharegpt") == (0.6, "its evaluation overall")
    assert evaluated_acceptance(TAGS, "cuda", "grounded") is None
    assert evaluated_acceptance({}, "cpu", "grounded") is None
    assert evaluated_acceptance({"cpu/acceptance_rate": "n/a"}, "cpu", "live") is None
