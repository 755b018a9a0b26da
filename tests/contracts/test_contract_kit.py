"""The GPU run kit's manifest (tests/fixtures/contracts/kit-manifest.json) and the
evaluation bundle it carries (kit-bundle/), as today's ``build_kit`` and
``prepare_bundle`` wrote them: today's readers take them, and today's builders write the
same after the same normalisation."""

from __future__ import annotations

import json
import shutil

import pytest

from tasks.evaluate.remote import read_bundle
from tasks.gpu.manifest import KIT_FORMAT, MANIFEST, read_manifest

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py


def test_todays_reader_takes_the_kit_manifest(fixtures, tmp_path, gen):
    shutil.copy(fixtures / "kit-manifest.json", tmp_path / MANIFEST)
    manifest = read_manifest(tmp_path)
    assert manifest.format == KIT_FORMAT and manifest.hardware == "cpu"
    assert {"code", "model", "bundle"} <= set(manifest.files)
    # Read and written back, nothing is lost or renamed.
    written = json.loads(json.dumps(manifest.to_dict()))  # tuples as JSON lists
    assert written == gen.read_json(fixtures / "kit-manifest.json")


def test_todays_reader_takes_the_bundle(fixtures, tmp_path, gen):
    bundle = tmp_path / "bundle"
    shutil.copytree(fixtures / "kit-bundle", bundle)
    for name in gen.read_json(bundle / "request.json")["contenders"]:
        shutil.copytree(fixtures / "packages" / "pld", bundle / "packages" / name)
    request, prompts = read_bundle(bundle)
    assert request["hardware"] == "cpu" and [p.id for p in prompts] == ["p0", "p1"]


def test_todays_builders_write_the_same_kit(gen, world, fixtures, new_mlflow_store):
    uri = new_mlflow_store(world.work / "kit-again" / "mlflow.db")
    built = gen.build_kit_fixture(world, fixtures / "packages", tracking_uri=uri)
    stored = gen.read_json(fixtures / "kit-manifest.json")
    assert gen.name_paths(built["kit.json"]) == gen.name_paths(stored)  # names a key changed
    assert built["kit.json"] == stored
    for name in ("request.json", "prompts.json"):
        assert built[name] == gen.read_json(fixtures / "kit-bundle" / name)
