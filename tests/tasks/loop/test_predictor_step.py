"""The loop's predictor step without Prefect: tiny target, character tokenizer, a real
MLflow SQLite registry. Trained on replayed prompt-lookup traffic, registered as the
target's challenger, judged interleaved on the champion draft, promoted only through the
gates; a predictor that never saw the champion's kind of draft is not judged."""

import pytest

import tasks.loop.data_steps as data_steps
import tasks.loop.targets as targets
from registry.client import Registry
from registry.config import RegistryConfig
from registry.predictor import champion_predictor, predictor_by_alias
from serving.engine.drafters.package import DraftManifest, write_package
from serving.hardware import engine_target
from tasks.data.curate import curate
from tasks.loop.predictor_step import retrain_predictor

pytestmark = pytest.mark.slow  # collects traffic, trains and gates a predictor per test

TEXTS = [f"{w} {w} {w} {w} and {w} again, {w} {w}" for w in
         ("abc", "cat", "hello", "1212", "teh", "aaaa", "xyz", "moon")]  # fmt: skip


@pytest.fixture
def registry(tmp_path, mlflow_uri):
    return Registry(RegistryConfig(tracking_uri=mlflow_uri, artifact_root=str(tmp_path / "a")))


@pytest.fixture
def world(tmp_path, monkeypatch, loaded_on, make_prompts, registry):
    monkeypatch.setattr(targets, "target_for", lambda hardware, source=None: loaded_on(hardware))
    # A fixed draft length: the replayed traffic (what the predictor learns from) must not
    # follow measured times, or a loaded machine drafts less and the data changes.
    package = write_package(tmp_path / "pld", DraftManifest(drafter="pld:3", k=4, policy="fixed"))
    draft = registry.log_draft(package, family="ngram")
    registry.log_evaluation(draft, "cpu", {"speedup": 1.0})
    registry.promote(draft, "cpu", reason="test setup")
    prompts = make_prompts(TEXTS)
    data_steps.replay_traffic(
        prompts, package=package, draft_label=draft.label, store_root=tmp_path / "store",
        run_id="r", hardware=engine_target("cpu"), max_new_tokens=24, progress=False,
    )  # fmt: skip
    curate(tmp_path / "store", tmp_path / "dataset", heldout_share=0.25)
    return tmp_path, prompts


def test_the_predictor_is_registered_judged_and_promoted_only_through_the_gates(world, registry):
    tmp_path, prompts = world
    outcome = retrain_predictor(
        registry, tmp_path / "dataset", tmp_path / "out", prompts, hardware=engine_target("cpu"),
        cache=tmp_path / "cache", max_new_tokens=16,
    )  # fmt: skip
    assert outcome.skipped is None, outcome.skipped
    assert predictor_by_alias(registry, "challenger", "cpu").label == outcome.challenger
    assert outcome.champion is None and outcome.gate is not None
    checks = {check.name: check for check in outcome.gate.checks}
    assert checks["lossless"].passed  # the predictor-driven cascade decodes plain's output
    assert not any("acceptance" in name for name in checks)
    champion = champion_predictor(registry, "cpu")
    if outcome.gate.passed:
        assert outcome.promoted == champion.label == outcome.challenger
    else:
        assert outcome.promoted is None and champion is None


def test_a_predictor_that_never_saw_the_champions_drafter_is_not_judged(world, registry):
    tmp_path, prompts = world
    head_like = write_package(
        tmp_path / "ngram", DraftManifest(drafter="ngram:3", k=4, policy="cost")
    )
    other = registry.log_draft(head_like, family="ngram")
    registry.log_evaluation(other, "cpu", {"speedup": 2.0})
    registry.promote(other, "cpu", reason="test: another kind of draft serves")
    outcome = retrain_predictor(
        registry, tmp_path / "dataset", tmp_path / "out", prompts, hardware=engine_target("cpu"),
        cache=tmp_path / "cache", max_new_tokens=16, promote=True,
    )  # fmt: skip
    assert outcome.challenger is not None and outcome.gate is None and outcome.promoted is None
    assert "trained on stages ['pld'], not on 'ngram'" in outcome.skipped


def test_too_little_data_is_a_reason_not_a_crash(tmp_path, registry):
    (tmp_path / "dataset").mkdir()
    outcome = retrain_predictor(
        registry, tmp_path / "dataset", tmp_path / "out", [], hardware=engine_target("cpu"),
        cache=tmp_path / "cache", max_new_tokens=16,
    )  # fmt: skip
    assert outcome.skipped and outcome.skipped.startswith("no predictor trained")
    assert outcome.challenger is None
