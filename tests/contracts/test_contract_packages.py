"""Draft packages of every kind, as today's writers made them (tests/fixtures/contracts/
packages/): today's reader loads each and serves with it, and today's writers still write
the same manifest, files and keys."""

from __future__ import annotations

import pytest

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.kinds import DRAFTER_KINDS, KIND_BY_NAME, split_spec, stage_of
from serving.engine.drafters.package import load_package, read_manifest
from serving.engine.policy import make_policy
from serving.hardware import engine_target
from serving.models.tiny import tiny_llama

KINDS = ("pld", "ngram", "ngram-store", "suffix", "layers", "model", "head", "lora")
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py

PROMPT = [3, 4, 5, 65, 3, 4, 5, 65, 3, 4, 5]  # "abc abc abc" in the character tokenizer


@pytest.fixture(scope="module")
def target(gen):
    return gen.as_target(tiny_llama(seed=0), gen.char_tokenizer(), eos=[])


def test_the_fixtures_cover_every_kind_that_has_a_package_form(gen, fixtures):
    assert tuple(gen.PACKAGE_KINDS) == KINDS
    kinds = {split_spec(read_manifest(fixtures / "packages" / name).drafter)[0] for name in KINDS}
    drafting = {kind.name for kind in DRAFTER_KINDS if kind.stage is not None}
    assert kinds == drafting, "a drafter kind was added or renamed: give it a package fixture"
    assert sorted(p.name for p in (fixtures / "packages").iterdir()) == sorted(KINDS)


@pytest.mark.parametrize("name", KINDS)
def test_todays_reader_loads_the_package_and_serves_losslessly(gen, fixtures, target, name):
    folder = fixtures / "packages" / name
    manifest = read_manifest(folder)
    spec = manifest.spec(folder)
    assert spec.kind in KIND_BY_NAME
    assert str(folder) in str(spec) or not KIND_BY_NAME[spec.kind].files  # paths stay inside
    loaded, drafter = load_package(folder, target)
    assert loaded == manifest and drafter is not None
    assert stage_of(drafter.kind) == KIND_BY_NAME[spec.kind].stage
    policy = make_policy(manifest.policy, manifest.k, verify_curve=engine_target("cpu").curve)
    plain = SpeculativeDecoder(target).generate(PROMPT, max_new_tokens=12)
    drafted = SpeculativeDecoder(target, drafter=drafter, policy=policy).generate(
        PROMPT, max_new_tokens=12
    )
    assert drafted.token_ids == plain.token_ids


@pytest.mark.parametrize("name", KINDS)
def test_todays_writers_write_the_same_package(gen, fixtures, built, name):
    # Manifest (the description's figures masked), file names, and the keys of specops'
    # own JSON files; weights are compared by name only.
    assert gen.package_contract(built[name].folder) == gen.package_contract(
        fixtures / "packages" / name
    )
