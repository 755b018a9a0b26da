"""The watched champion: live acceptance over its newest served requests against what its
evaluation predicted, per workload."""

from __future__ import annotations

from serving.records.schema import RequestRecord
from tasks.loop.watch import WatchSettings, judge
from tests.tasks.data.test_validate import make_record

TAGS = {
    "cpu/traffic:humaneval/acceptance_rate": "0.60",  # its held-out traffic slice
    "cpu/grounded/acceptance_rate": "0.80",
}
SETTINGS = WatchSettings(newest=4, share=0.5)


def _served(n: int, accepted: int, *, workload="humaneval", by="ngram/3", start=0, drafted=10):
    """Records as the store keeps them, with only the counts the watch reads changed
    (``model_construct``: a real record's steps would have to add up to them)."""
    base = make_record(0)
    return [
        RequestRecord.model_construct(
            **{**base, "id": f"{workload}-{by}-{start + i}", "timestamp": 1_000.0 + start + i,
               "workload": workload, "drafter_version": by, "draft_tokens": drafted,
               "accepted_tokens": accepted}
        )
        for i in range(n)
    ]  # fmt: skip


def _judge(records):
    return judge(records, hardware="cpu", champion="ngram/3", champion_tags=TAGS,
                 settings=SETTINGS)  # fmt: skip


def test_a_collapse_below_the_share_of_the_evaluated_acceptance_is_seen():
    healthy = _served(8, 6)
    collapsed, reasons = _judge(healthy + _served(4, 1, start=100))  # the newest four: 0.1
    assert collapsed
    (line,) = reasons
    assert "accepted 0.100 over its newest 4 requests, < 0.300" in line
    assert "0.5 x 0.600 accepted on its held-out traffic" in line
    assert _judge(healthy) == (False, [reasons[0].replace("0.100", "0.600").replace("<", ">=")])


def test_drafting_nothing_or_too_few_requests_are_not_judged():
    collapsed, reasons = _judge(_served(4, 0, drafted=0))
    assert not collapsed and "drafted nothing over its newest 4 requests: not judged" in reasons[0]
    assert _judge(_served(3, 0)) == (False, [])  # fewer than `newest`


def test_only_the_champions_own_requests_on_this_target_count():
    others = _served(8, 0, by="suffix/1") + _served(8, 0, workload="grounded", by="pld/1")
    assert _judge(others + _served(4, 6, start=50)) == (False, [
        "humaneval@cpu: ngram/3 accepted 0.600 over its newest 4 requests, >= 0.300 "
        "(0.5 x 0.600 accepted on its held-out traffic)"
    ])  # fmt: skip
    never = judge(_served(4, 0), hardware="cpu", champion="ngram/3", champion_tags={},
                  settings=SETTINGS)  # fmt: skip
    assert never == (False, [])  # never evaluated: nothing to compare with
