"""A shipped head: small, checked by its checksums, refused with the rebuild command when
changed, and still the head that was trained (it decodes exactly, drafts accepted)."""

from __future__ import annotations

import json

import pytest
import torch

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.head import HeadDrafter
from serving.engine.policy import FixedK
from serving.errors import ModelSourceError
from serving.models.head import load_head
from tasks.evaluate.head_score import score_head
from tasks.evaluate.ship_head import MANIFEST_FILE, ship_head, verify_shipped_head
from tasks.train.train_head import write_head_package
from tests.tasks.lean_heads import lean_teacher_and_head

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def lean(lean_int4):
    return lean_int4


@pytest.fixture(scope="module")
def shipped(lean, tmp_path_factory):
    root = tmp_path_factory.mktemp("ship")
    teacher, config, result = lean_teacher_and_head(lean, root, prompts=10, new_tokens=20, seed=9)
    package = write_head_package(result, config, root / "package", k=4)
    score = score_head(package, teacher, lean, k=4)
    (root / "score.json").write_text(score.model_dump_json())
    manifest = ship_head(package, teacher, root / "score.json", root / "heads" / "base")
    return root, manifest


def test_the_shipped_head_records_its_origin_and_verifies(shipped):
    root, manifest = shipped
    folder = root / "heads" / "base"
    assert verify_shipped_head(folder) == manifest
    assert manifest.corpus.sequences == 10 and manifest.corpus.features_from == "cpu-int4"
    assert manifest.steps == 60 and manifest.train_tokens > 0
    assert manifest.heldout.k == 4 and manifest.target["step"] == "lean"
    assert set(manifest.files) == {"head/head_config.json", "head/head.safetensors"}


def test_the_shipped_head_is_bfloat16_and_still_decodes_exactly(lean, shipped):
    from safetensors.torch import load_file

    root, _ = shipped
    weights = load_file(str(root / "heads/base/head/head.safetensors"))
    assert all(t.dtype == torch.bfloat16 for t in weights.values() if t.is_floating_point())
    head = load_head(root / "heads/base/head", lean.model)
    prompt = [5, 9, 33, 40, 7, 12]
    plain = SpeculativeDecoder(lean).generate(prompt, max_new_tokens=20).token_ids
    decoder = SpeculativeDecoder(lean, drafter=HeadDrafter(head, lean), policy=FixedK(4))
    result = decoder.generate(prompt, max_new_tokens=20)
    assert result.token_ids == plain


@pytest.mark.parametrize("damage", ["weights", "config", "manifest"])
def test_a_changed_shipped_head_is_refused_with_the_rebuild_command(shipped, tmp_path, damage):
    import shutil

    root, _ = shipped
    folder = tmp_path / "base"
    shutil.copytree(root / "heads" / "base", folder)
    if damage == "weights":
        path = folder / "head/head.safetensors"
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
        fragment = "head/head.safetensors does not match its checksum"
    elif damage == "config":
        path = folder / "head/head_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "rms_norm_eps": 0.1}))
        fragment = "head/head_config.json does not match its checksum"
    else:
        (folder / MANIFEST_FILE).write_text("{}")
        fragment = "not a shipped head's manifest"
    with pytest.raises(ModelSourceError, match=fragment) as caught:
        verify_shipped_head(folder)
    assert "dvc repro base_ship" in str(caught.value)
