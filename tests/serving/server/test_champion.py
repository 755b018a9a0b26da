import json

import pytest

from serving.engine.build import policy_for
from serving.engine.drafters.champion import Champion
from serving.engine.drafters.package import DraftManifest, write_package
from serving.engine.drafters.plan import DraftPlan
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.errors import ModelSourceError
from serving.hardware import hardware_target
from serving.server.champion import ChampionWatcher, LocalChampion, StaticChampion
from serving.target import LoadedTarget


def point(pointer, package, version):
    pointer.write_text(json.dumps({"package": str(package), "version": version}))


@pytest.fixture
def packages(tmp_path):
    return {
        "pld": write_package(tmp_path / "pld", DraftManifest(drafter="pld:3", k=5)),
        "ngram": write_package(tmp_path / "ngram", DraftManifest(drafter="ngram:4", k=7)),
    }


def test_static_champion_is_the_configured_spec(loaded):
    champion = StaticChampion(DraftPlan.parse("pld:2", policy="fixed", k=3)).current()
    draft = champion.loaded(loaded)
    first, second = draft.new_drafter(), draft.new_drafter()
    assert isinstance(first, PromptLookupDrafter) and first is not second
    assert policy_for(draft.plan, loaded).describe() == {"name": "fixed", "k": 3}
    request = draft.plan.with_limits(policy="adaptive", k=2)  # a request's override
    assert policy_for(request, loaded).describe()["name"].startswith("adaptive")


def test_static_champion_none_decodes_plainly(loaded):
    draft = StaticChampion(DraftPlan.parse("none")).current().loaded(loaded)
    assert draft.new_drafter() is None


def test_local_champion_reads_the_pointer(tmp_path, packages):
    pointer = tmp_path / "champion.json"
    point(pointer, packages["ngram"], "7")
    champion = LocalChampion(pointer).current()
    assert (champion.version, champion.package, champion.plan.k) == ("7", packages["ngram"], 7)


def test_a_relative_package_path_is_taken_from_the_pointer_folder(tmp_path, packages):
    pointer = tmp_path / "champion.json"
    pointer.write_text(json.dumps({"package": "pld"}))
    assert LocalChampion(pointer).current().package == tmp_path / "pld"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        ("{oops", "unreadable"),
        ('{"version": "1"}', "needs a string 'package'"),
        ('{"package": "nowhere"}', "draft.json is missing"),
    ],
)
def test_bad_pointers_fail_with_the_reason(tmp_path, content, message):
    pointer = tmp_path / "champion.json"
    if content is not None:
        pointer.write_text(content)
    with pytest.raises(ModelSourceError, match=message):
        LocalChampion(pointer).current()


def test_the_watcher_swaps_to_a_new_champion(tmp_path, loaded, packages):
    pointer = tmp_path / "champion.json"
    point(pointer, packages["pld"], "1")
    watcher = ChampionWatcher(LocalChampion(pointer), loaded)
    before = watcher.current
    in_flight = before.new_drafter()
    assert not watcher.poll()  # unchanged
    point(pointer, packages["ngram"], "2")
    assert watcher.poll()
    assert watcher.current.version == "2" and watcher.swaps == 1
    assert str(watcher.current.plan.drafter) == "ngram:4"
    # A request that started before the swap keeps its own drafter.
    assert isinstance(in_flight, PromptLookupDrafter)


def test_a_champion_that_fails_to_load_leaves_the_current_one_serving(tmp_path, loaded, packages):
    pointer = tmp_path / "champion.json"
    point(pointer, packages["pld"], "1")
    watcher = ChampionWatcher(LocalChampion(pointer), loaded)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "draft.json").write_text('{"drafter": "pld", "k": 999}')
    point(pointer, broken, "2")
    assert not watcher.poll()
    assert watcher.current.version == "1"
    assert "bad draft.json" in (watcher.last_error or "")


def test_a_missing_champion_at_start_is_a_clear_error(tmp_path, loaded):
    with pytest.raises(ModelSourceError, match="does not exist"):
        ChampionWatcher(
            LocalChampion(tmp_path / "nope.json"),
            loaded,
        )


def test_the_registry_champion_is_served_and_swapped(tmp_path, loaded, packages, mlflow_uri):
    from registry.client import Registry, RegistryError
    from registry.config import RegistryConfig
    from serving.server.champion import RegistryChampion

    config = RegistryConfig(tracking_uri=mlflow_uri, artifact_root=str(tmp_path / "art"))
    registry = Registry(config)
    source = RegistryChampion(hardware_target("cpu"), cache=tmp_path / "cache", registry=registry)
    with pytest.raises(RegistryError, match="no champion for hardware target 'cpu'"):
        source.current()

    def promote(package, family, **metrics):
        draft = registry.log_draft(package, family=family)
        registry.log_evaluation(draft, "cpu", {"mean_accepted_length": 1.0, **metrics})
        registry.promote(registry.get(family, draft.version), "cpu", reason="test")
        return draft

    first = promote(packages["pld"], "ngram", acceptance_rate=0.6)
    watcher = ChampionWatcher(source, loaded)
    assert watcher.current.version == first.label
    assert str(watcher.current.plan.drafter) == "pld:3"
    assert watcher.current.evaluated_acceptance == 0.6  # its evaluation overall
    second = promote(packages["ngram"], "suffix", **{"traffic:live/acceptance_rate": 0.4})
    assert watcher.poll()
    assert watcher.current.version == second.label
    assert str(watcher.current.plan.drafter) == "ngram:4"
    assert watcher.current.evaluated_acceptance == 0.4  # its held-out live traffic


def test_with_missing_plain_a_replica_serves_plain_until_the_first_champion(
    tmp_path, loaded, packages, mlflow_uri
):
    from registry.client import Registry
    from registry.config import RegistryConfig
    from serving.server.champion import RegistryChampion

    config = RegistryConfig(tracking_uri=mlflow_uri, artifact_root=str(tmp_path / "art"))
    registry = Registry(config)
    source = RegistryChampion(
        hardware_target("cpu"), cache=tmp_path / "cache", registry=registry, missing="plain"
    )
    watcher = ChampionWatcher(source, loaded)
    assert watcher.current.version == RegistryChampion.NO_CHAMPION
    assert watcher.current.new_drafter() is None  # plain decoding
    assert not watcher.poll()
    draft = registry.log_draft(packages["pld"], family="ngram")
    registry.log_evaluation(draft, "cpu", {"mean_accepted_length": 1.0})
    registry.promote(registry.get("ngram", draft.version), "cpu", reason="first champion")
    assert watcher.poll()
    assert watcher.current.version == draft.label
    assert str(watcher.current.plan.drafter) == "pld:3"


def test_any_failure_while_polling_keeps_the_champion(tmp_path, loaded, packages, monkeypatch):
    pointer = tmp_path / "champion.json"
    point(pointer, packages["pld"], "1")
    calls = []
    load = Champion.loaded

    def loading(champion: Champion, target: LoadedTarget) -> Champion:
        calls.append(champion.version)
        if len(calls) > 1:
            raise RuntimeError("tracking store locked")  # not a SpecOpsError
        return load(champion, target)

    monkeypatch.setattr(Champion, "loaded", loading)
    watcher = ChampionWatcher(LocalChampion(pointer), loaded)
    point(pointer, packages["ngram"], "2")
    assert not watcher.poll()
    assert watcher.current.version == "1"
    assert "tracking store locked" in (watcher.last_error or "")
