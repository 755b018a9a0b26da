from flows.deployments import SCHEDULES, deployments


def test_the_loop_is_deployed_with_its_schedules():
    built = {f"{d.flow_name}/{d.name}": d for d in deployments("cpu")}
    assert set(built) == {"collect/hourly", "retrain/daily", "evaluate-and-promote/on-demand"}
    for name, cron in SCHEDULES.items():
        (schedule,) = built[name].schedules
        assert schedule.schedule.cron == cron
        assert built[name].parameters["hardware"] == "cpu"
    assert built["collect/hourly"].entrypoint == "flows/loop.py:collect"
