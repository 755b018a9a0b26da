import json

import pytest

from serving.engine.drafters.package import DraftManifest, read_manifest, write_package
from serving.errors import ModelSourceError


def test_write_then_read_a_weightless_package(tmp_path):
    folder = write_package(tmp_path / "pkg", DraftManifest(drafter="ngram:4", k=6, family="ngram"))
    manifest = read_manifest(folder)
    assert (manifest.drafter, manifest.k, manifest.policy) == ("ngram:4", 6, "cost")
    assert str(manifest.spec(folder)) == "ngram:4"


def test_a_path_spec_resolves_inside_the_package(tmp_path):
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    folder = write_package(
        tmp_path / "pkg", DraftManifest(drafter="model:weights"), files={"weights": weights}
    )
    spec = read_manifest(folder).spec(folder)
    assert spec.kind == "model" and spec.arg == str(folder / "weights")


def test_rewriting_a_package_replaces_it_whole(tmp_path):
    write_package(tmp_path / "pkg", DraftManifest(drafter="pld:3"))
    write_package(tmp_path / "pkg", DraftManifest(drafter="ngram:3"))
    assert read_manifest(tmp_path / "pkg").drafter == "ngram:3"
    assert [p.name for p in tmp_path.iterdir()] == ["pkg"]  # no temporaries left behind


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (None, "draft.json is missing"),
        ("{not json", "bad draft.json"),
        ({"drafter": "pld", "k": 0}, "bad draft.json"),
        ({"drafter": "pld", "unknown": 1}, "bad draft.json"),
        ({"drafter": "pld", "policy": "fastest"}, "unknown policy"),
        ({"drafter": "warp:9"}, "unknown drafter"),
        ({"drafter": "model:../elsewhere"}, "must stay inside the package"),
        ({"drafter": "model:/abs/path"}, "must stay inside the package"),
        ({"drafter": "model:missing"}, "is not a model folder"),
    ],
)
def test_bad_packages_fail_with_the_reason(tmp_path, manifest, message):
    folder = tmp_path / "pkg"
    folder.mkdir()
    if manifest is not None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        (folder / "draft.json").write_text(text)
    with pytest.raises(ModelSourceError, match=message):
        read_manifest(folder)


def test_a_package_that_would_not_load_is_never_written(tmp_path):
    with pytest.raises(ModelSourceError):
        write_package(tmp_path / "pkg", DraftManifest(drafter="model:weights"))
    assert not (tmp_path / "pkg").exists()
    assert list(tmp_path.iterdir()) == []
