"""The loop's flows under a Prefect test harness, on the tiny target with a real MLflow
SQLite registry in a temporary folder."""

import os
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

import tasks.data.traffic as traffic
import tasks.loop.learned as learned
import tasks.loop.retrain_config as retrain_config
import tasks.loop.targets as targets
from registry.client import Registry
from registry.history import last_retrain
from serving.engine.drafters.package import DraftManifest, write_package
from serving.hardware import HardwareTarget, engine_target, hardware_target
from serving.models.tiny import tiny_llama
from serving.records import store as record_store
from serving.target import LoadedTarget, eos_ids
from tasks.data.store_view import StoreView, read_valid_records
from tasks.loop import (
    champion_steps,
    evaluation_steps,
    evaluation_tasks,
    registry_tasks,
    training_steps,
)
from tasks.loop.results import Bootstrapped, DeploymentRun, Retrained
from tests.tasks.loop.base_head import ship_tiny_head
from tests.tasks.loop.priced_gates import use_priced_gates

pytestmark = pytest.mark.slow  # flows under a Prefect server, training drafts: minutes

LOAD = retrain_config.load_retrain_config  # the real loader, before any test patches it


@pytest.fixture
def harness(prefect_harness):
    """The session's Prefect test server (tests/conftest.py)."""


@pytest.fixture
def world(monkeypatch, tmp_path, target, char_tokenizer, make_prompts, mlflow_uri):
    """The tiny target and character tokenizer stand in for the real model; prompts come
    from the tests' small texts; the registry is a fresh SQLite store."""
    monkeypatch.setenv("SPECOPS_MLFLOW_URI", mlflow_uri)
    monkeypatch.setenv("SPECOPS_MLFLOW_ARTIFACTS", str(tmp_path / "artifacts"))

    def loaded_on(hardware: HardwareTarget) -> LoadedTarget:
        """The tiny target as the flows load it for ``hardware`` (its model as it is)."""
        eos = eos_ids(target, char_tokenizer)
        return LoadedTarget.of(target, char_tokenizer, hardware=hardware, eos_token_ids=eos)

    monkeypatch.setattr(targets, "target_for", lambda hardware, source=None: loaded_on(hardware))

    def workload(name, n, *, seed=0, split="heldout"):
        return make_prompts()[:n]  # six short texts with repeats (tests/conftest.py)

    monkeypatch.setattr(traffic, "build_workload", workload)
    # The learned challengers train on the tiny target too, within a few seconds each.
    stock = loaded_on(engine_target(learned.TRAINING_HARDWARE))
    monkeypatch.setattr(learned, "training_target", lambda target=None: stock)
    config = tmp_path / "retrain.yaml"
    config.write_text(TINY_RETRAIN)
    monkeypatch.setattr(retrain_config, "load_retrain_config", lambda path=config: LOAD(path))
    return tmp_path


TINY_RETRAIN = """
relative_threshold: 0.8
cooldown_minutes: 0
targets:
  cpu:
    families: [head, lora]
    min_sequences: 2
    min_answer_tokens: 8
    head:
      budget_seconds: 2
      settings:
        {batch_size: 2, max_seq_len: 64, eval_every: 5, checkpoint_every: 5, eval_fraction: 0.0}
    lora:
      budget_seconds: 2
      settings: {layers: 1, loss: ce, lora_r: 2, lora_alpha: 4, batch_size: 2, max_seq_len: 64,
                 eval_every: 5, checkpoint_every: 5, eval_fraction: 0.0}
"""


def register_pld(tmp_path):
    package = write_package(tmp_path / "pld", DraftManifest(drafter="pld:3", k=4, policy="fixed"))
    return registry_tasks.register.fn(package, "ngram")


def watched_pld_champion(world, monkeypatch):
    """A pld champion, evaluated and promoted, under a watch over each workload's newest 4
    requests (half the evaluated acceptance)."""
    monkeypatch.setattr(
        retrain_config, "load_retrain_config",
        lambda path=None: LOAD(world / "retrain.yaml").model_copy(
            update={"watch": retrain_config.WatchSettings(newest=4, share=0.5)}
        ),
    )  # fmt: skip
    registry = Registry()
    first = register_pld(world)
    registry.log_evaluation(registry.get("ngram", first.version), "cpu", {"speedup": 1.0})
    registry.promote(registry.get("ngram", first.version), "cpu", reason="test setup")
    return first


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
    challenger = registry_tasks.register.fn(package, "lora")
    decision = evaluate_and_promote(
        [challenger], hardware="cpu", workloads=["grounded"], prompts_per_workload=6,
        max_new_tokens=24, cache=str(world / "cache"),
    )  # fmt: skip
    assert decision.promoted is None
    (result,) = decision.gates.values()
    # A draft as dear as the target that accepts ~nothing: the pre-gate predicts it far
    # below the lookup champion, so it is never timed; the reason is on its version.
    assert not result.passed and "pre-gate: predicted modelled speedup" in result.reason
    assert Registry().champion("cpu").label == f"{champion.name}/{champion.version}"
    refused = Registry().get("lora", challenger.version)
    assert refused.tags["pregate.cpu"] == result.checks[0].detail
    assert not refused.evaluated_on("cpu")  # nothing was timed to log
    # The champion's evaluation is logged per hardware target.
    assert Registry().get("ngram", champion.version).evaluated_on("cpu")


def test_collect_rolls_a_collapsed_champion_back(harness, world, monkeypatch):
    from flows.loop import collect

    registry = Registry()
    first = watched_pld_champion(world, monkeypatch)
    # Promoted next: a draft whose evaluation said it accepts 90 %, but whose weights serve
    # untrained (as after damage): it accepts ~nothing on live traffic.
    tiny_llama(seed=11).save_pretrained(world / "damaged-weights")
    package = write_package(
        world / "damaged",
        DraftManifest(drafter="model:weights", k=4, policy="fixed", family="lora"),
        files={"weights": world / "damaged-weights"},
    )
    second = registry_tasks.register.fn(package, "lora")
    registry.log_evaluation(registry.get("lora", second.version), "cpu", {"acceptance_rate": 0.9})
    registry.promote(registry.get("lora", second.version), "cpu", reason="test setup")
    result = collect(
        hardware="cpu", store=str(world / "store"), work=str(world / "work"),
        replay_workload="grounded", replay_prompts=6, run_id="w1", max_new_tokens=24,
        version=False, trigger_retrain=False,
    )  # fmt: skip
    watch = result.watch
    assert watch is not None and watch.collapsed, watch
    assert watch.champion == second.label
    assert watch.rolled_back_to == first.label
    assert Registry().champion("cpu").label == watch.rolled_back_to
    held = Registry().get("lora", second.version)
    assert held.tags["rolled_back.cpu"].startswith("watch: live acceptance collapsed")
    # The retrain trigger then weighs the restored champion, not the damaged one.
    assert result.trigger.champion == watch.rolled_back_to
    # Its shadow scores: the restored champion replayed over the traffic the damaged one
    # served (the rolled-back promotion displaced nothing to score as a previous champion).
    shadow = result.shadow
    assert shadow is not None and shadow.error is None, shadow
    assert [(s.label, s.role, s.records) for s in shadow.scores] == [(first.label, "champion", 6)]
    assert Registry().client.get_run(shadow.run_id).data.tags["kind"] == "shadow"
    # A second collect on the same records: the damaged version no longer serves.
    again = collect(
        hardware="cpu", store=str(world / "store"), work=str(world / "work"),
        version=False, trigger_retrain=False,
    )  # fmt: skip
    assert again.watch is not None and not again.watch.collapsed


def _count_store_reads(monkeypatch, store: Path) -> list[tuple[Path, bool]]:
    """Every opening of a file of ``store`` for reading from now on (a writer's own hidden
    temporary file aside: it opens it to fsync it), with whether validation's incremental
    read (:func:`tasks.data.incremental.validate_incrementally`: the new parts' digests for
    the ledger, then their rows) made it."""
    import builtins
    import io

    from tasks.data import curate as curate_module

    reads: list[tuple[Path, bool]] = []
    validating = [False]
    root, real_open = str(store.resolve()) + os.sep, io.open

    def counting_open(file, mode="r", *args, **kwargs):
        if isinstance(file, str | os.PathLike) and "r" in mode and "+" not in mode:
            path = os.path.abspath(file)
            if path.startswith(root) and not os.path.basename(path).startswith("."):
                reads.append((Path(path), validating[0]))
        return real_open(file, mode, *args, **kwargs)

    real_validate = curate_module.validate_incrementally

    def validate_incrementally(*args, **kwargs):
        validating[0] = True
        try:
            return real_validate(*args, **kwargs)
        finally:
            validating[0] = False

    monkeypatch.setattr(io, "open", counting_open)  # pathlib's opens
    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(curate_module, "validate_incrementally", validate_incrementally)
    return reads


def test_one_collect_reads_each_store_file_at_most_once_beyond_validation(
    harness, world, monkeypatch
):
    """After validation, the watch, the shadow scores and the retrain trigger judge the
    champion on the view validation left (tasks/data/store_view.py): in one collect, no
    file of the store is read more than once besides validation's own reads (the replay
    reads the store once, for the ids it holds; retention reads only parts of days on or
    before its cutoff, none here), and no record part at all after validation."""
    from flows.loop import collect

    first = watched_pld_champion(world, monkeypatch)
    store = world / "store"
    kwargs = dict(
        hardware="cpu", store=str(store), work=str(world / "work"), replay_workload="grounded",
        replay_prompts=6, max_new_tokens=16, version=False, trigger_retrain=False,
    )  # fmt: skip
    collect(**kwargs, run_id="first")  # the store and the validation ledger to start from
    earlier = set(record_store.part_files(store))
    reads = _count_store_reads(monkeypatch, store)
    result = collect(**kwargs, run_id="second")
    new = set(record_store.part_files(store)) - earlier
    assert earlier and new
    validated = {path for path, during in reads if during}
    assert validated == new  # validation read only the new parts
    beyond = Counter(path for path, during in reads if not during)
    assert set(beyond) <= earlier and max(beyond.values()) == 1, beyond  # the replay's read
    # The steps judged the champion on the twelve records it served, none read again.
    assert result.watch is not None and result.watch.champion == first.label, result.watch
    assert result.shadow is not None and result.shadow.error is None, result.shadow
    assert [s.records for s in result.shadow.scores] == [8]  # the newest 8 of 12
    assert "grounded@cpu" in result.trigger.reasons[0]


def _self_weighted_head(world, target):
    """A draft with weights, registered as a head: the tiny target itself (whole, it
    accepts every draft)."""
    target.save_pretrained(world / "self-weights")
    package = write_package(
        world / "self",
        DraftManifest(drafter="model:weights", k=4, policy="fixed", family="head"),
        files={"weights": world / "self-weights"},
    )
    return registry_tasks.register.fn(package, "head")


def test_the_drill_damages_a_promoted_draft_and_the_watch_restores_its_predecessor(
    harness, world, monkeypatch, target
):
    """The main job's drill (flows/demo.py) on the tiny target: a draft with weights (the
    target's own, so it accepts every draft when whole) is evaluated and promoted by hand,
    its weights are scrambled where serving loads them, and the next collect rolls it back."""
    from flows.demo import damaged_champion_drill
    from tasks.loop.results import DraftRef

    first = watched_pld_champion(world, monkeypatch)
    draft = _self_weighted_head(world, target)
    drill = damaged_champion_drill(
        hardware="cpu", store=str(world / "store"), work=str(world / "work"),
        draft=DraftRef(family="head", version=draft.version), workload="grounded",
        eval_prompts=4, max_new_tokens=24,
    )  # fmt: skip
    assert (drill.draft, drill.displaced) == (draft.label, first.label)
    # Evaluated before its promotion: whole, it accepted (nearly) every draft.
    evaluated = Registry().get("head", draft.version)
    assert evaluated.evaluated_on("cpu") and float(evaluated.tags["cpu/acceptance_rate"]) > 0.9
    assert drill.scrambled and all(name.endswith(".safetensors") for name in drill.scrambled)
    # Damaged, it served the collect's requests (it loaded), then the watch restored the pld.
    assert drill.collected is not None and drill.collected.replayed is not None
    assert drill.collected.replayed.champion == draft.label
    watch = drill.collected.watch
    assert watch is not None and watch.collapsed and drill.restored, watch
    assert Registry().champion("cpu").label == first.label
    assert "rolled_back.cpu" in Registry().get("head", draft.version).tags


def test_a_drill_run_again_after_its_hand_promotion_restores_the_champion_before_it(
    harness, world, monkeypatch, target
):
    """A drill interrupted after it promoted its draft by hand, run again: the draft serves,
    so the champion to restore is the one its promotion displaced (not itself), and its
    evaluation before the promotion stands (not re-timed on a copy perhaps damaged)."""
    from flows.demo import damaged_champion_drill
    from tasks.loop.results import DraftRef

    first = watched_pld_champion(world, monkeypatch)
    draft = _self_weighted_head(world, target)
    registry = Registry()
    version = registry.get("head", draft.version)
    registry.log_evaluation(version, "cpu", {"speedup": 1.5, "acceptance_rate": 0.95})
    registry.promote(version, "cpu", reason="the first run of the drill, interrupted after this")
    drill = damaged_champion_drill(
        hardware="cpu", store=str(world / "store"), work=str(world / "work"),
        draft=DraftRef(family="head", version=draft.version), workload="grounded",
        eval_prompts=4, max_new_tokens=24,
    )  # fmt: skip
    assert (drill.draft, drill.displaced, drill.evaluated) == (draft.label, first.label, None)
    assert float(Registry().get("head", draft.version).tags["cpu/acceptance_rate"]) == 0.95
    assert drill.collected is not None and drill.collected.watch is not None
    assert drill.collected.watch.collapsed and drill.restored, drill.collected.watch
    assert Registry().champion("cpu").label == first.label


def test_collect_triggers_retrain_and_a_rerun_duplicates_nothing(harness, world, monkeypatch):
    from flows.loop import collect

    # The first champion, promoted directly (whether pld beats plain decoding on the tiny
    # target is a matter of timing, which this test is not about).
    first = register_pld(world)
    registry = Registry()
    registry.log_evaluation(registry.get("ngram", first.version), "cpu", {"speedup": 1.0})
    registry.promote(registry.get("ngram", first.version), "cpu", reason="test setup")
    store = str(world / "store")
    kwargs = dict(
        hardware="cpu", store=store, work=str(world / "work"), replay_workload="grounded",
        replay_prompts=6, run_id="t1", max_new_tokens=24, version=False, threshold=1.01,
    )  # fmt: skip
    first_run = collect(**{**kwargs, "trigger_retrain": False})
    assert first_run.replayed.written == 6 and first_run.retrained is None
    records = len(list(record_store.read_raw(world / "store")))
    # A re-run of the same slot (a killed run started again) writes nothing twice.
    again = collect(**{**kwargs, "trigger_retrain": False})
    assert again.replayed.written == 0 and again.replayed.skipped_existing == 6
    assert len(list(record_store.read_raw(world / "store"))) == records
    # Rolling acceptance below the threshold (the champion has no acceptance evaluated, so
    # the absolute one applies) triggers the retrain flow.
    result = collect(**{**kwargs, "replay_prompts": 0})
    assert result.trigger.retrain, result.trigger
    retrained = result.retrained
    assert isinstance(retrained, Retrained)  # in this process: no retrain deployment
    families = [c.family for c in retrained.challengers]
    assert families == ["suffix", "head", "lora"], retrained.trained
    labels = {c.label for c in retrained.challengers}
    assert set(retrained.decision.gates) == labels
    registry = Registry()
    for challenger in retrained.challengers:
        version = registry.get(challenger.family, challenger.version)
        assert version.evaluated_on("cpu")
        assert version.tags["git_commit"] and version.tags["data_version"]  # lineage
    head = registry.get("head", retrained.challengers[1].version)
    history = registry.client.get_metric_history(head.run_id, "train/loss")
    assert [m.step for m in history] == sorted(m.step for m in history) and history  # a curve
    # The held-out traffic was evaluated beside the built-in prompts, never trained on.
    assert set(retrained.decision.by_source) == {"builtin", "traffic"}
    # The acceptance predictor was retrained on the same data, registered as the target's
    # challenger with its held-out metrics, and judged by the gates on the champion draft.
    # (It learned from prompt-lookup records: when this run promoted another kind of draft,
    # it is not judged on it, and says so; tests/tasks/loop/test_predictor_step.py has the
    # gate itself.)
    predictor = retrained.predictor
    assert predictor.challenger and {"brier", "ece"} <= set(predictor.metrics)
    if predictor.gate is None:
        assert "trained on stages ['pld']" in (predictor.skipped or ""), predictor
    else:
        names = [check.name for check in predictor.gate.checks]
        assert "lossless" in names and not any("acceptance" in name for name in names)
    # The retrain is on record: a trigger right after it is held back by the cool-down.
    assert last_retrain(registry, "cpu") is not None
    monkeypatch.setattr(Registry, "champion", lambda self, hardware: None)  # absolute rule
    monkeypatch.setattr(
        retrain_config, "load_retrain_config",
        lambda path=None: LOAD(world / "retrain.yaml").model_copy(update={"cooldown_minutes": 60}),
    )  # fmt: skip
    view = StoreView(world / "store", hardware_target("cpu"), read_valid_records(store))
    trigger = champion_steps.retrain_trigger(registry, view, absolute=1.01, now=time.time())
    assert trigger.wanted and not trigger.retrain and "cool-down" in (trigger.held_back or "")


@pytest.fixture
def torch_threads():
    """torch's thread count as the test found it, whatever the flows set meanwhile."""
    threads = torch.get_num_threads()
    yield threads
    torch.set_num_threads(threads)


def test_a_flow_killed_midway_moves_no_alias_and_reruns(harness, world, monkeypatch, torch_threads):
    """Killed inside the promotion (the audit run written, the alias about to move): the
    champion alias stays where it was, on every family, and a rerun promotes."""
    from mlflow.tracking import MlflowClient

    from flows.loop import evaluate_and_promote

    use_priced_gates(monkeypatch, world)  # the challenger must pass: see priced_gates.py
    registry = Registry()
    first = register_pld(world)
    champion = registry.get("ngram", first.version)
    registry.log_evaluation(champion, "cpu", {"speedup": 1.0})
    registry.promote(champion, "cpu", reason="test setup")
    # The same drafter in another family: identical checks, so under the priced gates it
    # is as fast as the champion, which is enough with no gain required.
    package = write_package(world / "lookup", DraftManifest(drafter="pld:3", k=4, policy="fixed"))
    challenger = registry_tasks.register.fn(package, "lookup")
    moves: list[str] = []
    real_move = MlflowClient.set_registered_model_alias

    def killed_at_the_alias_move(client, name, alias, version):
        if alias != "champion-cpu":  # the challenger alias, set before the evaluation
            return real_move(client, name, alias, version)
        moves.append(f"{name}@{alias}={version}")
        raise KeyboardInterrupt("killed inside the promotion, at the alias move")

    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", killed_at_the_alias_move)
    kwargs = dict(
        hardware="cpu", workloads=["grounded"], prompts_per_workload=6, max_new_tokens=16,
        cache=str(world / "cache"),
    )  # fmt: skip
    with pytest.raises(BaseException, match="killed inside the promotion"):
        evaluate_and_promote([challenger], **kwargs)
    assert moves == [f"{challenger.label.rsplit('/', 1)[0]}@champion-cpu={challenger.version}"]
    # It got that far: the gates passed, the audit run and the promotion time are written ...
    killed = registry.get("lookup", challenger.version)
    assert "promoted_at.cpu" in killed.tags
    audits = registry.client.search_runs(
        [registry.promotions_id], filter_string="tags.family = 'lookup'"
    )
    assert len(audits) == 1
    # ... and no alias moved: the champion serves on, nothing else holds its alias.
    assert registry.champion("cpu").label == champion.label
    assert registry.by_alias("lookup", "champion-cpu") is None
    assert registry.by_alias("ngram", "champion-cpu").label == champion.label

    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", real_move)
    decision = evaluate_and_promote([challenger], **kwargs)
    assert set(decision.gates) == {challenger.label}
    assert decision.champion == champion.label and decision.promoted == challenger.label
    assert registry.champion("cpu").label == challenger.label
    assert registry.by_alias("ngram", "champion-cpu") is None  # the old family let go


def test_bootstrap_registers_a_builtin_drafter_once(harness, world, monkeypatch):
    from flows.loop import bootstrap

    use_priced_gates(monkeypatch, world)  # prompt lookup must pass: see priced_gates.py
    result = bootstrap(
        hardware="cpu", drafter="pld:3", k=4, policy="fixed", workloads=["grounded"],
        prompts_per_workload=6, max_new_tokens=16, work=str(world / "work"),
    )  # fmt: skip
    decision = result.bootstrapped
    (label,) = decision.gates
    assert label == "specops-draft-ngram/1"
    # With no champion the gate compares with plain decoding, which prompt lookup cannot
    # lose to under the priced gates: promoted.
    assert decision.gates[label].passed, decision.gates[label].reason
    assert result.champion == decision.promoted == label
    registry = Registry()
    assert registry.champion("cpu").label == label
    again = bootstrap(hardware="cpu", work=str(world / "work"))
    assert again == Bootstrapped(champion=label, bootstrapped=None)
    name = registry.model_name("ngram")
    assert len(registry.client.search_model_versions(f"name = '{name}'")) == 1


def test_bootstrap_registers_the_shipped_base_head_beside_the_builtin_drafter(
    harness, world, monkeypatch
):
    from flows.loop import bootstrap
    from tests.serving.lean.models import tiny_target

    lean = tiny_target("int4", hidden_size=32, intermediate_size=64, num_layers=4)
    folder = ship_tiny_head(lean, world / "ship")  # a head for the tiny target's model
    config = LOAD(world / "retrain.yaml")
    cpu = config.targets["cpu"].model_copy(update={"base_head": str(folder)})
    changed = config.model_copy(update={"targets": {"cpu": cpu}})
    monkeypatch.setattr(retrain_config, "load_retrain_config", lambda path=None: changed)
    use_priced_gates(monkeypatch, world)
    result = bootstrap(
        hardware="cpu", drafter="pld:3", k=4, policy="fixed", workloads=["grounded"],
        prompts_per_workload=6, max_new_tokens=16, work=str(world / "work"),
    )  # fmt: skip
    assert set(result.bootstrapped.gates) == {"specops-draft-ngram/1", "specops-draft-head/1"}
    registry = Registry()
    head = registry.get("head", "1")
    assert head.evaluated_on("cpu") or "pregate.cpu" in head.tags  # judged there
    continued = training_steps.head_to_continue(registry, hardware_target("cpu"), world / "dl")
    assert (continued / "head_config.json").is_file()  # what the first retrain continues


def test_collect_starts_the_retrain_through_its_deployment_once_per_slot(
    harness, world, monkeypatch
):
    """With a retrain deployment, ``collect`` hands the retrain to it (``run_deployment``,
    so it runs on that deployment's work pool), keyed by the slot: a re-run of the same
    collect names the same retrain instead of starting a second one."""
    from types import SimpleNamespace

    import prefect.deployments
    from prefect.states import Scheduled

    from flows.loop import collect

    first = register_pld(world)
    registry = Registry()
    registry.log_evaluation(registry.get("ngram", first.version), "cpu", {"speedup": 1.0})
    registry.promote(registry.get("ngram", first.version), "cpu", reason="test setup")
    calls = []

    def run_deployment(name, **kwargs):
        calls.append((name, kwargs))
        return SimpleNamespace(id="0000", name="retrain-run", state=Scheduled())

    monkeypatch.setattr(prefect.deployments, "run_deployment", run_deployment)
    kwargs = dict(
        hardware="cpu", store=str(world / "store"), work=str(world / "work"),
        replay_workload="grounded", replay_prompts=3, run_id="t1", max_new_tokens=16,
        version=False, force_retrain=True, retrain_deployment="retrain/daily",
        retrain_options={"run_slot": "20261124T0300", "budgets": {"head": 1.0}},
    )  # fmt: skip
    result = collect(**kwargs)
    again = collect(**kwargs)
    assert result.retrained == again.retrained == DeploymentRun(
        deployment="retrain/daily", flow_run="0000", name="retrain-run", state="Scheduled",
    )  # fmt: skip
    assert len(calls) == 2 and calls[0] == calls[1]
    name, sent = calls[0]
    assert name == "retrain/daily" and sent["timeout"] == 0 and sent["as_subflow"]
    assert sent["idempotency_key"] == "retrain/daily:cpu:20261124T0300"
    assert sent["parameters"]["run_slot"] == "20261124T0300"
    assert sent["parameters"]["budgets"] == {"head": 1.0}


def test_collect_removes_old_traffic_before_it_validates(harness, world):
    """Retention runs first in ``collect``: the old part leaves the store, the validated
    batches and the dataset rebuilt from them; the new traffic stays."""
    import json

    from flows.loop import collect
    from tasks.data import ledger
    from tests.tasks.data.test_validate import make_record

    store, work = world / "store", world / "work"
    now = time.time()
    for name, when, ids in (("old", now - 40 * 86_400, [1, 2]), ("new", now - 3600, [3, 4])):
        rows = [make_record(i, timestamp=when + i) for i in ids]
        part = record_store.partition_dir(store, "cpu", when) / record_store.part_name(name, 0)
        record_store.write_part(part, rows)
    kwargs = dict(hardware="cpu", store=str(store), work=str(work), version=False,
                  trigger_retrain=False)  # fmt: skip
    first = collect(**kwargs, retention_days=365)
    assert first.retention.removed == [] and first.validation.validation.valid == 4

    result = collect(**kwargs, retention_days=30)
    (old,) = result.retention.removed
    assert "part-old-" in old and not (store / old).exists()
    assert result.retention.datasets[0].batches_rewritten == 1
    assert result.validation.validation.valid == 2
    dataset = work / "dataset"
    ids = {
        json.loads(line)["id"]
        for path in dataset.glob("*.jsonl")
        if path.name != "quarantine.jsonl"
        for line in path.read_text().splitlines()
    }
    assert ids == {"req-3", "req-4"}
    assert set(ledger.load_ledger(ledger.folder_of(dataset)).parts()) == {  # type: ignore[union-attr]
        record_store.part_key(store, p) for p in record_store.part_files(store)
    }


def test_promotions_on_one_target_take_turns_under_its_concurrency_limit(
    harness, world, monkeypatch
):
    """Two evaluate-and-promote steps on one target never overlap once the target's global
    concurrency limit exists (the team stack creates it): the second evaluates against the
    champion the first left."""
    import threading

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    from tasks.settings import promotion_limit

    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name=promotion_limit("cpu"), limit=1)
        )
    inside: list[str] = []
    overlaps: list[list[str]] = []
    lock = threading.Lock()

    class Decision:
        def to_dict(self):
            return {}

    def evaluate_and_decide(registry, drafts, prompts, *, hardware, **kwargs):
        with lock:
            inside.append(hardware.name)
            overlaps.append(list(inside))
        time.sleep(1.0)
        with lock:
            inside.remove(hardware.name)
        return Decision()

    monkeypatch.setattr(evaluation_steps, "evaluate_and_decide", evaluate_and_decide)

    def step(hardware):
        evaluation_tasks.evaluate_gate_promote.fn(
            [], hardware=hardware_target(hardware), workloads=[], prompts_per_workload=0,
            max_new_tokens=8, cache=world / "cache",
        )  # fmt: skip

    threads = [threading.Thread(target=step, args=("cpu",)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [len(seen) for seen in overlaps] == [1, 1]  # one at a time on cpu
