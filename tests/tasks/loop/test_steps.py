"""The loop's plain steps without Prefect (``tasks/loop/*_steps.py``): tiny target,
character tokenizer, a real MLflow SQLite registry in a temporary folder."""

import re

import pytest
import torch

import tasks.loop.targets as targets
from registry.client import Registry
from registry.config import RegistryConfig
from serving.engine.drafters.package import DraftManifest, read_manifest, write_package
from serving.errors import BadInputError
from serving.hardware import engine_target, hardware_target
from tasks.data.curate import curate
from tasks.data.dataset import read_part
from tasks.loop import data_steps, evaluation_steps, registry_steps, training_steps
from tests.tasks.loop.base_head import naming_base_head, ship_tiny_head
from tests.tasks.loop.priced_gates import use_priced_gates

CPU = hardware_target("cpu")


@pytest.fixture
def registry(tmp_path, mlflow_uri):
    return Registry(RegistryConfig(tracking_uri=mlflow_uri, artifact_root=str(tmp_path / "a")))


@pytest.fixture
def tiny(monkeypatch, loaded_on):
    monkeypatch.setattr(targets, "target_for", lambda hardware, source=None: loaded_on(hardware))


def test_replay_then_a_suffix_challenger_from_the_collected_outputs(tmp_path, tiny, make_prompts):
    package = write_package(tmp_path / "pld", DraftManifest(drafter="pld:3", k=4, policy="fixed"))
    summary = data_steps.replay_traffic(
        make_prompts(), package=package, draft_label="t/1", store_root=tmp_path / "store",
        run_id="r", hardware=engine_target("cpu"), max_new_tokens=16, progress=False,
    )  # fmt: skip
    assert summary.written == len(make_prompts())
    curate(tmp_path / "store", tmp_path / "dataset", heldout_share=0.25)
    records = training_steps.trainable_records(tmp_path / "store", tmp_path / "dataset")
    held = {r.id for r in read_part(tmp_path / "dataset", "heldout_traffic")}
    assert held and records and not held & {r.id for r in records}  # never trained on
    challenger = training_steps.train_suffix_challenger(records, tmp_path / "out")
    manifest = read_manifest(challenger)
    assert manifest.drafter == "suffix:corpus.json" and manifest.family == "suffix"
    assert (challenger / "corpus.json").is_file()


@pytest.mark.slow
def test_evaluate_and_decide_logs_gates_and_promotes(
    tmp_path, tiny, registry, make_prompts, monkeypatch
):
    use_priced_gates(monkeypatch, tmp_path)  # prompt lookup must pass: see priced_gates.py
    draft = registry.log_draft(
        write_package(tmp_path / "pld", DraftManifest(drafter="pld:3", k=4, policy="fixed")),
        family="ngram",
    )
    decision = evaluation_steps.evaluate_and_decide(
        registry, [draft], make_prompts(), hardware=engine_target("cpu"), cache=tmp_path / "cache",
        max_new_tokens=16, progress=False,
    )  # fmt: skip
    assert decision.champion is None
    assert registry.get("ngram", draft.version).evaluated_on("cpu")
    (gate,) = decision.gates.values()
    assert gate.passed, gate.reason
    assert [c.name for c in gate.checks] == [
        "lossless",
        "enough prompts",
        "faster than plain decoding",
    ]
    assert decision.promoted == draft.label == registry.champion("cpu").label
    # Exported on promotion where a backend can load it.
    assert decision.exports["vllm"] == "exported (for cpu-vllm)"  # vLLM's ngram method
    assert decision.exports["mlx"].startswith("not exported")  # mlx-lm has no lookup
    assert decision.results["plain"].lossless
    assert decision.labels == {"challenger-0": draft.label}
    # The registry keeps the evaluation as measured (the gates judged its priced speed).
    measured = decision.results["challenger-0"].speedup
    assert registry.get("ngram", draft.version).tags["cpu/speedup"] == repr(measured)


@pytest.mark.slow
def test_a_challenger_the_pre_gate_refused_is_tagged_and_never_timed(
    tmp_path, tiny, registry, make_prompts, monkeypatch
):
    use_priced_gates(monkeypatch, tmp_path)
    gates_file = tmp_path / "gates.yaml"  # the pre-gate on, with no margin
    gates_file.write_text(
        gates_file.read_text().replace("pregate_margin: null", "pregate_margin: 0.0")
    )
    champion = registry.log_draft(
        write_package(tmp_path / "pld", DraftManifest(drafter="pld:3", k=4, policy="cost")),
        family="ngram",
    )
    registry.log_evaluation(champion, "cpu", {"speedup": 1.0})
    registry.promote(registry.get("ngram", champion.version), "cpu", reason="test setup")
    # The target's first layer as a draft: a share of a pass per drafted token.
    layer = registry.log_draft(
        write_package(tmp_path / "layer", DraftManifest(drafter="layers:1", k=4, policy="fixed")),
        family="layers",
    )
    decision = evaluation_steps.evaluate_and_decide(
        registry, [layer], make_prompts(), hardware=engine_target("cpu"), cache=tmp_path / "cache",
        max_new_tokens=16, progress=False,
    )  # fmt: skip
    gate = decision.gates[layer.label]
    if gate.passed or "pre-gate" not in gate.reason:
        pytest.skip("on this tiny target the layer draft was not predicted to lose")
    assert [c.name for c in gate.checks] == ["pre-gate"]
    assert decision.promoted is None and "challenger-0" not in decision.results
    tag = registry.get("layers", layer.version).tags["pregate.cpu"]
    assert tag.startswith("predicted modelled speedup")
    assert not registry.get("layers", layer.version).evaluated_on("cpu")  # nothing timed


def test_no_champion_is_a_clear_error(tmp_path, registry):
    with pytest.raises(BadInputError, match="no champion on hardware target 'cpu'"):
        registry_steps.champion_package(registry, hardware_target("cpu"), tmp_path)


def test_builtin_package_writes_a_registrable_manifest(tmp_path):
    package = registry_steps.builtin_package(
        "ngram:4", tmp_path, k=6, policy="fixed", family="ngram"
    )
    manifest = read_manifest(package)
    assert (manifest.drafter, manifest.k, manifest.policy) == ("ngram:4", 6, "fixed")


@pytest.mark.parametrize("drafter", ["suffix", "model:/nowhere", "nonsense:1"])
def test_builtin_package_refuses_drafters_with_files_or_unknown(tmp_path, drafter):
    with pytest.raises(BadInputError, match=re.escape(drafter)):
        registry_steps.builtin_package(drafter, tmp_path)


def test_the_head_to_continue_is_the_head_champion_else_the_newest_evaluated(tmp_path, registry):
    assert training_steps.head_to_continue(registry, CPU, tmp_path / "cache") is None
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "head_config.json").write_text("{}")

    def head_package(name: str):
        manifest = DraftManifest(drafter="head:head", k=2, family="head")
        package = write_package(tmp_path / name, manifest, {"head": weights})
        return registry.log_draft(package, family="head")

    older, newer = head_package("h1"), head_package("h2")
    assert training_steps.head_to_continue(registry, CPU, tmp_path / "cache") is None  # unevaluated
    for draft in (older, newer):
        registry.log_evaluation(draft, "cpu", {"speedup": 1.0})
    found = training_steps.head_to_continue(registry, CPU, tmp_path / "cache")
    assert found.name == "head" and f"{newer.version}-" in found.parent.name
    registry.promote(registry.get("head", older.version), "cpu", reason="test")
    found = training_steps.head_to_continue(registry, CPU, tmp_path / "cache")
    assert f"{older.version}-" in found.parent.name and (found / "head_config.json").is_file()


@pytest.fixture(scope="module")
def shipped_head(lean_int4, tmp_path_factory):
    return ship_tiny_head(lean_int4, tmp_path_factory.mktemp("shipped"))


def test_the_shipped_base_head_registers_once_and_the_retrain_continues_it(
    tmp_path, tiny, registry, shipped_head, monkeypatch, lean_int4
):
    from serving.models.head import load_head

    naming_base_head(monkeypatch, None)
    assert registry_steps.register_base_head(registry, CPU, tmp_path / "w") is None
    naming_base_head(monkeypatch, shipped_head)
    first = registry_steps.register_base_head(registry, CPU, tmp_path / "w")
    again = registry_steps.register_base_head(registry, CPU, tmp_path / "w2")
    assert first == again and first.family == "head"  # once per weights file
    version = registry.get("head", first.version)
    manifest = read_manifest(registry.download(version, tmp_path / "dl"))
    assert (
        manifest.drafter == "head:head" and manifest.k == 4 and "base head" in manifest.description
    )
    params = registry.client.get_run(version.run_id).data.params
    assert params["init"] == "shipped base head" and "heldout_agreement" in params
    registry.log_evaluation(version, "cpu", {"speedup": 1.0})
    continued = training_steps.head_to_continue(registry, CPU, tmp_path / "cache")
    want = load_head(shipped_head / "head").state_dict()
    got = load_head(continued, lean_int4.model)
    assert all(torch.equal(got.state_dict()[name], want[name]) for name in want)


def test_a_changed_shipped_base_head_is_refused_before_it_registers(
    tmp_path, tiny, registry, shipped_head, monkeypatch
):
    import shutil

    from serving.errors import ModelSourceError

    copy = tmp_path / "base"
    shutil.copytree(shipped_head, copy)
    weights = copy / "head" / "head.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    naming_base_head(monkeypatch, copy)
    with pytest.raises(
        ModelSourceError, match=r"head\.safetensors does not match.*dvc repro base_ship"
    ):
        registry_steps.register_base_head(registry, CPU, tmp_path / "w")
    name = registry.model_name("head")
    assert registry.client.search_model_versions(f"name = '{name}'") == []


def test_a_base_head_of_another_target_model_is_skipped_by_name(
    tmp_path, registry, shipped_head, monkeypatch, char_tokenizer, caplog
):
    from serving.models.tiny import tiny_llama
    from serving.target import LoadedTarget

    other = LoadedTarget.of(tiny_llama(seed=11), char_tokenizer, hardware=CPU, eos_token_ids=[2])
    monkeypatch.setattr(targets, "target_for", lambda hardware, source=None: other)
    naming_base_head(monkeypatch, shipped_head)
    assert registry_steps.register_base_head(registry, CPU, tmp_path / "w") is None
    assert "trained on another target model (embedding_digest" in caplog.text
    name = registry.model_name("head")
    assert registry.client.search_model_versions(f"name = '{name}'") == []
