"""The loop's flows under a Prefect test harness, on the tiny target with a real MLflow
SQLite registry in a temporary folder."""

import pytest
import torch

import tasks.loop.prefect_tasks as steps
import tasks.loop.steps as loop
from registry.client import Registry
from serving.drafters.package import DraftManifest, write_package
from serving.models.tiny import tiny_llama
from serving.records import store as record_store


@pytest.fixture(scope="module")
def harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture
def world(monkeypatch, tmp_path, target, char_tokenizer, make_prompts):
    """The tiny target and character tokenizer stand in for the real model; prompts come
    from the tests' small texts; the registry is a fresh SQLite store."""
    monkeypatch.setenv("SPECOPS_MLFLOW_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setenv("SPECOPS_MLFLOW_ARTIFACTS", str(tmp_path / "artifacts"))
    monkeypatch.setattr(
        loop, "target_for", lambda hardware, target="smollm2": (target_model, char_tokenizer)
    )
    target_model = target

    def workload(name, n, *, seed=0, split="heldout"):
        return make_prompts()[:n]  # six short texts with repeats (tests/conftest.py)

    monkeypatch.setattr(steps, "build_workload", workload)
    return tmp_path


def register_pld(tmp_path):
    package = write_package(tmp_path / "pld", DraftManifest(drafter="pld:3", k=4, policy="fixed"))
    return steps.register.fn(str(package), "ngram")


def test_a_randomly_initialised_draft_is_refused(harness, world):
    from flows.loop import evaluate_and_promote

    registry = Registry()
    champion = registry.log_draft(
        write_package(world / "pld", DraftManifest(drafter="pld:3", k=4, policy="fixed")),
        family="ngram",
    )
    registry.log_evaluation(champion, "cpu", {"speedup": 1.0})
    registry.promote(registry.get("ngram", champion.version), "cpu", reason="test setup")
    random_draft = tiny_llama(seed=11)  # same vocabulary, untrained: accepts ~nothing
    random_draft.save_pretrained(world / "random-weights")
    package = write_package(
        world / "random",
        DraftManifest(drafter="model:weights", k=4, policy="fixed", family="lora"),
        files={"weights": world / "random-weights"},
    )
    challenger = steps.register.fn(str(package), "lora")
    decision = evaluate_and_promote(
        [challenger], hardware="cpu", workloads=["grounded"], prompts_per_workload=6,
        max_new_tokens=24, cache=str(world / "cache"),
    )  # fmt: skip
    assert decision["promoted"] is None
    (result,) = decision["gates"].values()
    assert not result["passed"] and "faster than the champion" in result["reason"]
    assert Registry().champion("cpu").label == f"{champion.name}/{champion.version}"
    # The evaluation is logged per hardware target on both versions.
    assert Registry().get("lora", challenger["version"]).evaluated_on("cpu")


def test_collect_triggers_retrain_and_a_rerun_duplicates_nothing(harness, world):
    from flows.loop import collect

    # The first champion, promoted directly (whether pld beats plain decoding on the tiny
    # target is a matter of timing, which this test is not about).
    first = register_pld(world)
    registry = Registry()
    registry.log_evaluation(registry.get("ngram", first["version"]), "cpu", {"speedup": 1.0})
    registry.promote(registry.get("ngram", first["version"]), "cpu", reason="test setup")
    store = str(world / "store")
    kwargs = dict(
        hardware="cpu", store=store, work=str(world / "work"), replay_workload="grounded",
        replay_prompts=6, run_id="t1", max_new_tokens=24, version=False, threshold=1.01,
    )  # fmt: skip
    first_run = collect(**{**kwargs, "trigger_retrain": False})
    assert first_run["replayed"]["written"] == 6 and first_run["retrained"] is None
    records = len(list(record_store.read_raw(world / "store")))
    # A re-run of the same slot (a killed run started again) writes nothing twice.
    again = collect(**{**kwargs, "trigger_retrain": False})
    assert again["replayed"]["written"] == 0 and again["replayed"]["skipped_existing"] == 6
    assert len(list(record_store.read_raw(world / "store"))) == records
    # Rolling acceptance below the threshold triggers the retrain flow.
    result = collect(**{**kwargs, "replay_prompts": 0})
    assert result["validation"]["retrain_wanted"]
    retrained = result["retrained"]
    assert retrained["challenger"]["family"] == "suffix"
    assert set(retrained["decision"]["gates"]) == {retrained["challenger"]["label"]}
    assert Registry().get("suffix", retrained["challenger"]["version"]).evaluated_on("cpu")


def test_a_flow_killed_midway_moves_no_alias_and_reruns(harness, world, monkeypatch):
    from flows.loop import evaluate_and_promote

    challenger = register_pld(world)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed during evaluation")

    original = loop.evaluate
    monkeypatch.setattr(loop, "evaluate", killed)
    with pytest.raises(BaseException, match="killed"):
        evaluate_and_promote(
            [challenger], hardware="cpu", workloads=["grounded"], prompts_per_workload=6,
            max_new_tokens=16, cache=str(world / "cache"),
        )  # fmt: skip
    assert Registry().champion("cpu") is None  # nothing half-done was promoted
    monkeypatch.setattr(loop, "evaluate", original)
    decision = evaluate_and_promote(
        [challenger], hardware="cpu", workloads=["grounded"], prompts_per_workload=6,
        max_new_tokens=16, cache=str(world / "cache"),
    )  # fmt: skip
    assert set(decision["gates"]) == {challenger["label"]}
    torch.set_num_threads(2)


def test_bootstrap_registers_a_builtin_drafter_once(harness, world):
    from flows.loop import bootstrap

    result = bootstrap(
        hardware="cpu", drafter="pld:3", k=4, policy="fixed", workloads=["grounded"],
        prompts_per_workload=6, max_new_tokens=16, work=str(world / "work"),
    )  # fmt: skip
    decision = result["bootstrapped"]
    (label,) = decision["gates"]
    assert label == "specops-draft-ngram/1"
    # With no champion the gate compares with plain decoding; on the tiny target whether
    # prompt lookup wins is the machine's timing, so the promotion follows the gate.
    passed = decision["gates"][label]["passed"]
    assert result["champion"] == (label if passed else None)
    assert (Registry().champion("cpu") is not None) == passed
    registry = Registry()
    if not passed:  # promote it directly, to see a second bootstrap leave a champion be
        registry.promote(registry.get("ngram", 1), "cpu", reason="test setup")
    again = bootstrap(hardware="cpu", work=str(world / "work"))
    assert again == {"champion": label, "bootstrapped": None}
    name = registry.model_name("ngram")
    assert len(registry.client.search_model_versions(f"name = '{name}'")) == 1
