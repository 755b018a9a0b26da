"""The champion (serving/engine/drafters/champion.py): what a draft package names, loaded
once against the target, a drafter of its own for every request, and the description the
server reports (its keys are what /health and the metrics carry)."""

from __future__ import annotations

import time

import pytest

from serving.engine.drafters.champion import Champion
from serving.engine.drafters.model import ModelDrafter
from serving.engine.drafters.ngram_store import NGramDrafter
from serving.engine.drafters.package import DraftManifest, write_package
from serving.engine.drafters.plan import DraftPlan
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.errors import BadInputError, ModelSourceError
from serving.models.tiny import tiny_llama

DESCRIBED = {"version", "source", "drafter", "package", "policy", "k", "loaded_at"}


@pytest.fixture
def package(tmp_path):
    plan = DraftPlan.parse("pld:3", policy="fixed", k=5)
    return write_package(tmp_path / "pld", DraftManifest.of(plan))


def test_a_package_names_its_champion_without_loading_it(package):
    champion = Champion.of_package(package, version="7", source="local")
    assert (champion.version, champion.source, champion.package) == ("7", "local", package)
    assert champion.plan == DraftPlan.parse("pld:3", policy="fixed", k=5)
    assert champion.evaluated_acceptance is None
    assert champion.prototype is None and champion.loaded_at is None and not champion.new_drafter()
    judged = Champion.of_package(package, version="8", source="registry", evaluated_acceptance=0.6)
    assert judged.evaluated_acceptance == 0.6


def test_a_bad_package_is_refused_before_anything_loads(tmp_path):
    with pytest.raises(ModelSourceError, match=r"draft\.json is missing"):
        Champion.of_package(tmp_path, version="1", source="local")
    (tmp_path / "draft.json").write_text('{"drafter": "pld", "k": 999}')
    with pytest.raises(ModelSourceError, match=r"bad draft\.json"):
        Champion.of_package(tmp_path, version="1", source="local")


def test_a_package_with_files_names_them_inside_it(tmp_path, loaded):
    tiny_llama(num_layers=1, seed=3).save_pretrained(tmp_path / "draft")
    folder = write_package(
        tmp_path / "pkg",
        DraftManifest(drafter="model:weights", policy="fixed", k=3, family="full"),
        files={"weights": tmp_path / "draft"},
    )
    champion = Champion.of_package(folder, version="1", source="local")
    # Its own copy of the weights, in the package (draft.json names them relative to it).
    assert champion.plan == DraftPlan.parse(f"model:{folder / 'weights'}", policy="fixed", k=3)
    assert champion.describe()["drafter"] == f"model:{folder / 'weights'}"
    assert isinstance(champion.loaded(loaded).new_drafter(), ModelDrafter)


def test_loading_builds_the_drafter_once_against_the_target(package, loaded):
    named = Champion.of_package(package, version="7", source="local")
    before = time.time()
    champion = named.loaded(loaded)
    assert before <= (champion.loaded_at or 0) <= time.time()
    assert isinstance(champion.prototype, PromptLookupDrafter)
    assert champion.prototype.max_ngram == 3
    assert (champion.version, champion.plan, champion.package) == (
        named.version,
        named.plan,
        named.package,
    )
    assert named.prototype is None and named.loaded_at is None  # the named one is unchanged


def test_every_request_gets_a_fork_of_its_own(loaded):
    champion = Champion("static:layers:2", "static", DraftPlan.parse("layers:2")).loaded(loaded)
    first, second = champion.new_drafter(), champion.new_drafter()
    assert isinstance(first, ModelDrafter) and isinstance(second, ModelDrafter)
    assert first is not second and champion.prototype not in (first, second)
    # Forks share the weights (the target's own first layers), not their caches.
    assert first.model is second.model is champion.prototype.model  # type: ignore[union-attr]
    assert first.model.model.model.embed_tokens is loaded.model.model.embed_tokens
    ngram = Champion("n", "static", DraftPlan.parse("ngram:3")).loaded(loaded)
    one, two = ngram.new_drafter(), ngram.new_drafter()
    assert isinstance(one, NGramDrafter) and one is not two


def test_plain_decoding_has_no_drafter(loaded):
    champion = Champion("static:none", "static", DraftPlan.parse("none")).loaded(loaded)
    assert champion.prototype is None and champion.new_drafter() is None
    assert champion.loaded_at is not None


def test_a_champion_that_does_not_fit_the_target_fails_to_load(loaded):
    with pytest.raises(BadInputError, match="layers:N needs 1 <= N < 4"):
        Champion("1", "static", DraftPlan.parse("layers:4")).loaded(loaded)


def test_its_description_keeps_its_keys(package, loaded):
    named = Champion.of_package(package, version="7", source="local")
    assert named.describe() == {
        "version": "7",
        "source": "local",
        "drafter": "pld:3",
        "package": str(package),
        "policy": "fixed",
        "k": 5,
        "loaded_at": None,
    }
    champion = named.loaded(loaded)
    described = champion.describe()
    assert set(described) == DESCRIBED
    assert described["loaded_at"] == champion.loaded_at is not None
    static = Champion("static:pld", "static", DraftPlan.parse("pld")).describe()
    assert set(static) == DESCRIBED and static["package"] is None
    assert (static["policy"], static["k"]) == ("cost", 10)
