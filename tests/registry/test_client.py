"""Aliases, promotion and rollback against a real MLflow SQLite store in a temporary folder."""

import pytest

from registry.client import Registry, RegistryError
from registry.config import RegistryConfig
from serving.engine.drafters.package import DraftManifest, read_manifest, write_package
from serving.errors import ModelSourceError


@pytest.fixture(scope="module")
def registry(tmp_path_factory, new_mlflow_store):
    """One store for the module (tests/conftest.py copies the session's migrated one)."""
    root = tmp_path_factory.mktemp("mlflow")
    return Registry(
        RegistryConfig(
            tracking_uri=new_mlflow_store(root / "mlflow.db"),
            artifact_root=str(root / "artifacts"),
            model_prefix="t",
        )
    )


@pytest.fixture
def package(tmp_path):
    def make(drafter: str, name: str = "pkg"):
        return write_package(tmp_path / name, DraftManifest(drafter=drafter, k=5))

    return make


def evaluated(registry, draft, hardware="cpu", **metrics):
    registry.log_evaluation(draft, hardware, metrics or {"mean_accepted_length": 1.5})
    return registry.get(draft.family, draft.version)


def test_drafts_register_as_versions_of_their_family(registry, package):
    first = registry.log_draft(package("pld:3"), family="ngram", params={"k": 5})
    second = registry.log_draft(package("ngram:4"), family="ngram")
    assert (first.name, second.name) == ("t-ngram", "t-ngram")
    assert int(second.version) == int(first.version) + 1
    assert "ngram" in registry.families()


def test_a_broken_package_never_gets_a_version(registry, tmp_path):
    (tmp_path / "bad").mkdir()
    with pytest.raises(ModelSourceError, match=r"draft\.json is missing"):
        registry.log_draft(tmp_path / "bad", family="broken")
    assert "broken" not in registry.families()


def test_promotion_needs_an_evaluation_on_that_target(registry, package):
    draft = registry.log_draft(package("pld:2"), family="gate")
    with pytest.raises(RegistryError, match="has not been evaluated on 'cpu'"):
        registry.promote(draft, "cpu", reason="test")
    evaluated(registry, draft, "cpu-stock")
    with pytest.raises(RegistryError, match="has not been evaluated on 'cpu'"):
        registry.promote(draft, "cpu", reason="test")


def test_promote_cross_family_then_roll_back(registry, package, tmp_path):
    hw = "cpu"
    assert registry.champion(hw) is None
    ngram = evaluated(registry, registry.log_draft(package("ngram:4"), family="ngram"), hw)
    registry.promote(ngram, hw, reason="bootstrap", metrics={"mean_accepted_length": 1.4})
    assert registry.champion(hw).label == ngram.label

    head = evaluated(registry, registry.log_draft(package("pld:3"), family="head"), hw)
    run_id = registry.promote(head, hw, reason="faster", gates={"lossless": True})
    assert registry.champion(hw).label == head.label
    # The alias moved across families: the old family no longer holds it.
    assert registry.by_alias("ngram", f"champion-{hw}") is None
    record = registry.client.get_run(run_id).data.tags
    assert record["previous_family"] == "ngram" and record["reason"] == "faster"

    restored = registry.rollback(hw, reason="regression seen in serving")
    assert restored.label == ngram.label
    assert registry.champion(hw).label == ngram.label
    assert registry.by_alias("head", f"champion-{hw}") is None
    # The first promotion had no previous champion: nothing further to roll back to.
    with pytest.raises(RegistryError, match="no previous champion"):
        registry.rollback(hw)


def test_a_watched_rollback_moves_only_the_judged_champion_and_holds_it(registry, package):
    hw = "cpu-int8"
    first = evaluated(registry, registry.log_draft(package("pld:1"), family="ngram"), hw)
    registry.promote(first, hw, reason="bootstrap")
    second = evaluated(registry, registry.log_draft(package("pld:2"), family="ngram"), hw)
    registry.promote(second, hw, reason="faster")
    # Another collect judged a champion that no longer serves: nothing moves.
    with pytest.raises(RegistryError, match="moved since it was judged; nothing rolled back"):
        registry.rollback(hw, reason="watch", expected_champion=first.label, hold=True)
    assert registry.champion(hw).label == second.label
    restored = registry.rollback(
        hw, reason="watch: collapsed", expected_champion=second.label, hold=True
    )
    assert restored.label == first.label == registry.champion(hw).label
    held = registry.get("ngram", second.version)
    assert held.tags[f"rolled_back.{hw}"] == "watch: collapsed"
    # The same collapse seen by a second collect: the alias moved already, once.
    with pytest.raises(RegistryError, match="moved since it was judged"):
        registry.rollback(hw, reason="watch", expected_champion=second.label, hold=True)
    # Held out of promotion until an operator clears it.
    with pytest.raises(RegistryError, match=r"was rolled back on 'cpu-int8' \(watch: collapsed\)"):
        registry.promote(held, hw, reason="retrain")
    assert registry.clear_rollback(held, hw) and not registry.clear_rollback(held, hw)
    registry.promote(registry.get("ngram", second.version), hw, reason="examined")
    assert registry.champion(hw).label == second.label


def test_the_previous_champion_the_challengers_and_a_shadow_run(registry, package):
    from registry.shadow import log_shadow

    hw = "cpu-int4"
    assert registry.previous_champion(hw) is None and registry.challengers(hw) == []
    first = evaluated(registry, registry.log_draft(package("pld:1"), family="ngram"), hw)
    registry.promote(first, hw, reason="bootstrap")
    assert registry.previous_champion(hw) is None  # the first promotion displaced nothing
    second = evaluated(registry, registry.log_draft(package("pld:2"), family="ngram"), hw)
    registry.promote(second, hw, reason="faster")
    assert registry.previous_champion(hw).label == first.label
    head = registry.log_draft(package("pld:3"), family="head")
    registry.set_challenger(head, hw)
    assert [d.label for d in registry.challengers(hw)] == [head.label]
    run_id = log_shadow(
        registry, hw, {f"{second.label}/live/acceptance_rate": 0.5},
        roles={second.label: "champion"}, skipped={"sampled": 2},
    )  # fmt: skip
    run = registry.client.get_run(run_id)
    assert run.data.tags["kind"] == "shadow" and run.data.tags["hardware"] == hw
    assert run.data.tags[f"role/{second.label}"] == "champion"
    assert run.data.metrics == {f"{second.label}/live/acceptance_rate": 0.5, "skipped/sampled": 2}


def test_champions_are_per_hardware_target(registry, package):
    a = evaluated(registry, registry.log_draft(package("pld:1"), family="ngram"), "cpu")
    b = evaluated(registry, registry.log_draft(package("pld:2"), family="ngram"), "cpu-stock")
    registry.promote(a, "cpu", reason="a")
    registry.promote(b, "cpu-stock", reason="b")
    assert registry.champion("cpu").version == a.version
    assert registry.champion("cpu-stock").version == b.version


def test_rollback_without_a_promotion_is_an_error(registry):
    with pytest.raises(RegistryError, match="no promotion on 'never' to roll back"):
        registry.rollback("never")


def test_download_gives_the_package_and_reuses_it(registry, package, tmp_path):
    draft = registry.log_draft(package("ngram:3"), family="dl")
    folder = registry.download(draft, tmp_path / "cache")
    assert read_manifest(folder).drafter == "ngram:3"
    assert registry.download(draft, tmp_path / "cache") == folder


def test_an_unknown_version_is_a_clear_error(registry):
    with pytest.raises(RegistryError, match="has no version '999'"):
        registry.get("ngram", 999)


def test_an_unreachable_tracking_server_is_a_clear_error():
    config = RegistryConfig(tracking_uri="http://127.0.0.1:9", artifact_root="/tmp/x")
    with pytest.raises(RegistryError, match="unreachable"):
        Registry(config)


@pytest.mark.parametrize("family", ["", "a/b", "x y"])
def test_bad_family_names(registry, family):
    with pytest.raises(RegistryError, match="draft family"):
        registry.model_name(family)


def test_a_report_run_keeps_its_files_and_metrics(registry, tmp_path):
    plot = tmp_path / "loop.png"
    plot.write_bytes(b"\x89PNG")
    run_id = registry.log_report("report", [plot], metrics={"cpu/gain": 0.4}, tags={"x": "y"})
    run = registry.client.get_run(run_id)
    assert run.data.metrics == {"cpu/gain": 0.4} and run.data.tags["kind"] == "report"
    assert [f.path for f in registry.client.list_artifacts(run_id)] == ["loop.png"]


def test_downloads_from_two_stores_never_collide(tmp_path, package, new_mlflow_store):
    cache = tmp_path / "cache"
    folders = []
    for store, drafter in (("one", "pld:2"), ("two", "ngram:5")):
        other = Registry(
            RegistryConfig(
                tracking_uri=new_mlflow_store(tmp_path / f"{store}.db"),
                artifact_root=str(tmp_path / store),
            )
        )
        draft = other.log_draft(package(drafter, name=f"pkg-{store}"), family="same")
        assert draft.label == "specops-draft-same/1"  # the same name and version in both
        folders.append(other.download(draft, cache))
    assert [read_manifest(f).drafter for f in folders] == ["pld:2", "ngram:5"]


def test_a_target_on_another_backend_needs_the_draft_exported_for_it(registry, package, tmp_path):
    from tasks.evaluate.export import export_draft

    draft = evaluated(registry, registry.log_draft(package("pld:2"), family="ported"), "cpu-vllm")
    with pytest.raises(RegistryError, match="has no vllm export"):
        registry.promote(draft, "cpu-vllm", reason="test")
    with pytest.raises(RegistryError, match="no export for backend 'vllm'"):
        registry.download_export(draft, "vllm", tmp_path / "cache")
    exported = export_draft(
        read_manifest_folder(draft, registry, tmp_path), "vllm", tmp_path / "export", k=3
    )
    registry.log_export(draft, "vllm", exported)
    registry.promote(draft, "cpu-vllm", reason="exported and evaluated there")
    assert registry.champion("cpu-vllm").version == draft.version
    assert registry.champion("cpu") is None or registry.champion("cpu").name != draft.name
    local = registry.download_export(draft, "vllm", tmp_path / "cache")
    assert (local / "export.json").read_text() == (exported / "export.json").read_text()


def read_manifest_folder(draft, registry, tmp_path):
    folder = registry.download(draft, tmp_path / "packages")
    read_manifest(folder)
    return folder


def test_training_curves_keep_their_steps_and_lineage_tags_reach_the_version(registry, package):
    curves = {"train/loss": [(0, 2.5), (10, 1.75), (20, 1.25)], "eval/acceptance": [(20, 0.5)]}
    lineage = {"data_version": "abc123", "git_commit": "0f1e2d"}
    draft = registry.log_draft(package("pld:3"), family="curved", curves=curves, tags=lineage)
    for name, points in curves.items():
        history = registry.client.get_metric_history(draft.run_id, name)
        assert sorted((m.step, m.value) for m in history) == points
    assert registry.get("curved", draft.version).tags == {**lineage, "family": "curved"}
    assert registry.client.get_run(draft.run_id).data.tags["data_version"] == "abc123"


@pytest.mark.parametrize(
    ("points", "fragment"),
    [
        ([(-1, 1.0)], "step -1 is not an integer >= 0"),
        ([(1.5, 1.0)], "step 1.5 is not an integer >= 0"),
        ([(1, float("nan"))], "at step 1: nan is not finite"),
        ([(1, "low")], "at step 1: 'low' is not a number"),
        ([3.0], r"3\.0 is not a \(step, value\) pair"),
    ],
)
def test_a_bad_curve_point_is_refused_before_a_version_exists(registry, package, points, fragment):
    with pytest.raises(RegistryError, match=fragment):
        registry.log_draft(package("pld:3"), family="badcurve", curves={"loss": points})
    assert "badcurve" not in registry.families()


def test_versions_resolve_from_family_or_full_label(registry, package):
    from serving.errors import BadInputError

    draft = registry.log_draft(package("pld:3"), family="named")
    assert registry.resolve(f"named/{draft.version}").label == draft.label
    assert registry.resolve(draft.label).label == draft.label
    with pytest.raises(RegistryError, match="t-named has no version '99'"):
        registry.resolve("named/99")
    for bad in ("named", "named/0", "named/x", "a b/1", "/1"):
        with pytest.raises(BadInputError, match="does not name a draft version"):
            registry.resolve(bad)
