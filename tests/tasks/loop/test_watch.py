"""The watched champion: live acceptance over its newest served requests against what its
evaluation predicted, per workload."""

from __future__ import annotations

from serving.hardware import hardware_target
from serving.records.schema import RequestRecord
from tasks.loop.watch import WatchSettings, judge
from tests.tasks.data.test_validate import make_record

TAGS = {
    "cpu/traffic:humaneval/acceptance_rate": "0.60",  # its held-out traffic slice
    "cpu/grounded/acceptance_rate": "0.80",
}
SETTINGS = WatchSettings(newest=4, share=0.5)
CPU = hardware_target("cpu")


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
    return judge(records, hardware=CPU, champion="ngram/3", champion_tags=TAGS,
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
    never = judge(_served(4, 0), hardware=CPU, champion="ngram/3", champion_tags={},
                  settings=SETTINGS)  # fmt: skip
    assert never == (False, [])  # never evaluated: nothing to compare with


def _vllm_champions(tmp_path, monkeypatch, mlflow_uri):
    """Two prompt-lookup drafts exported for vLLM, evaluated on ``cpu-vllm`` (accepting 0.6
    there) and promoted in turn, so the second serves with the first to restore; the watch's
    ``configs/retrain.yaml`` settings apply (newest 12 requests, half the acceptance)."""
    from registry.client import Registry
    from serving.engine.drafters.package import DraftManifest, write_package
    from tasks.loop.target_promotion import export_for_targets

    monkeypatch.setenv("SPECOPS_MLFLOW_URI", mlflow_uri)
    monkeypatch.setenv("SPECOPS_MLFLOW_ARTIFACTS", str(tmp_path / "artifacts"))
    registry = Registry()
    drafts = []
    for n in (2, 3):
        package = write_package(tmp_path / f"pld{n}", DraftManifest(drafter=f"pld:{n}", k=4))
        draft = registry.log_draft(package, family="ngram")
        export_for_targets(registry, draft, tmp_path / "cache")  # vLLM serves the export
        registry.log_evaluation(draft, "cpu-vllm", {"acceptance_rate": 0.6})
        registry.promote(registry.get("ngram", draft.version), "cpu-vllm", reason="test setup")
        drafts.append(draft)
    return registry, drafts


def _watched(registry, store):
    """``collect``'s watch on ``cpu-vllm``: over the view of a store validation found no
    record in, whose scraped windows the view reads as it is built."""
    from serving.hardware import hardware_target
    from tasks.data.store_view import StoreView
    from tasks.loop.champion_steps import watch_champion

    return watch_champion(registry, StoreView.of(store, hardware_target("cpu-vllm"), []))


def test_a_vllm_champion_collapsing_on_vllms_counters_is_rolled_back(
    tmp_path, monkeypatch, mlflow_uri
):
    """A vLLM target has no per-request records: the watch judges the windows its
    deployment scraped from vLLM's counters while the champion served."""
    from tests.tasks.data.test_vllm_acceptance import row, write_windows

    registry, (first, second) = _vllm_champions(tmp_path, monkeypatch, mlflow_uri)
    store = tmp_path / "store"
    # Before its promotion the first served well; the second has served 6 + 6 requests.
    write_windows(store, [
        row(1.0, first.label, 30, 100, 60),
        row(2.0, second.label, 6, 100, 60),
        row(3.0, second.label, 6, 100, 40),
    ])  # fmt: skip
    healthy = _watched(registry, store)
    assert not healthy.collapsed and healthy.reasons == [
        f"live@cpu-vllm: {second.label} accepted 0.500 over its newest 12 requests (vLLM's "
        "counters), >= 0.300 (0.5 x 0.600 accepted on its evaluation overall)"
    ]
    collapse = [row(4.0, second.label, 7, 100, 5), row(5.0, second.label, 7, 100, 3)]
    write_windows(store, collapse, run_id="later")
    watch = _watched(registry, store)
    assert watch.collapsed and watch.rolled_back_to == first.label, watch
    expected = "accepted 0.040 over its newest 14 requests (vLLM's counters), < 0.300"
    assert expected in watch.reasons[0]
    assert registry.champion("cpu-vllm").label == first.label
    assert "rolled_back.cpu-vllm" in registry.get("ngram", second.version).tags
    # From now on the restored champion is judged on its own windows (from before, too).
    again = _watched(registry, store)
    assert (again.champion, again.collapsed) == (first.label, False)
    assert "accepted 0.600 over its newest 30 requests" in again.reasons[0]


def test_too_few_scraped_requests_or_none_are_not_judged():
    from tasks.data.vllm_acceptance import ScrapedAcceptance
    from tasks.loop.watch import judge_scraped

    few = ScrapedAcceptance(workload="live", hardware="cpu-vllm", requests=3, draft_tokens=90,
                            accepted_tokens=0, acceptance=0.0)  # fmt: skip
    settings = WatchSettings(newest=4, share=0.5)
    tags = {"cpu-vllm/acceptance_rate": "0.6"}
    kwargs = dict(champion="ngram/3", champion_tags=tags, settings=settings)
    assert judge_scraped(few, **kwargs) == (False, [])
    assert judge_scraped(None, **kwargs) == (False, [])
    enough = few.model_copy(update={"requests": 4})
    assert judge_scraped(enough, **kwargs)[0]
    assert judge_scraped(enough, **{**kwargs, "champion_tags": {}}) == (False, [])
