"""What the team stack creates on a Prefect server before deploying: the work pool, one
promotion limit per hardware target, and the two automations that finish a flow run whose
worker died. Created once: a second call creates nothing."""

from __future__ import annotations

import pytest

from tasks.ops.prefect_setup import RESCHEDULE, ZOMBIE, prepare_prefect
from tasks.settings import promotion_limit

pytestmark = pytest.mark.slow  # a Prefect server (the session's, ~20 s to start)

# The session's server is shared: the flow tests create `promote-cpu` there, so this test
# prepares a hardware target of its own.
HARDWARE = "cpu-setup-test"


@pytest.fixture
def api_url(prefect_harness):
    """The session's Prefect test server (tests/conftest.py), shared with the flow tests,
    which create no work pool and no automation."""
    return prefect_harness


def test_pool_limits_and_automations_are_created_once(api_url):
    from prefect.client.orchestration import get_client

    env = {"PREFECT_API_URL": api_url}
    created = prepare_prefect("team-pool", env=env, hardware=[HARDWARE])
    assert created == {
        "pool": ["team-pool"],
        "limits": [promotion_limit(HARDWARE)],
        "automations": [ZOMBIE, RESCHEDULE],
    }
    again = prepare_prefect("team-pool", env=env, hardware=[HARDWARE])
    assert again == {"pool": [], "limits": [], "automations": []}
    with get_client(sync_client=True) as client:
        assert client.read_work_pool("team-pool").type == "process"
        limit = client.read_global_concurrency_limit_by_name(promotion_limit(HARDWARE))
        assert limit.limit == 1 and limit.active
        (reschedule,) = client.read_automations_by_name(RESCHEDULE)
        (action,) = reschedule.actions
        # A crashed specops run goes back to the pool, whatever its state machine says.
        assert action.state.value == "SCHEDULED" and action.force
        assert reschedule.trigger.match_related["prefect.resource.id"] == ["prefect.tag.specops"]
        (zombie,) = client.read_automations_by_name(ZOMBIE)
        assert zombie.trigger.posture.value == "Proactive"
        assert zombie.actions[0].state.value == "CRASHED"
