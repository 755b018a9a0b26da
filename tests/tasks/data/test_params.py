"""params.yaml: the shipped file loads, documents every key, and bad values name their key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from serving.errors import BadInputError
from serving.hardware import load_hardware
from tasks.data.params import PipelineParams, load_params

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "params.yaml"


def test_shipped_params_load():
    params = load_params(SHIPPED)
    assert params.traffic.workloads == ["sharegpt", "humaneval", "grounded"]
    assert params.collect.target == "smollm2"
    assert params.collect.hardware in load_hardware().targets
    assert 0.0 < params.dataset.failure_share <= 1.0
    assert params.dataset.heldout_share == 0.2


def test_shipped_params_list_every_key():
    """The file documents every setting: it names exactly the fields of each section."""
    raw = yaml.safe_load(SHIPPED.read_text())
    assert set(raw) == set(PipelineParams.model_fields)
    for section, field in PipelineParams.model_fields.items():
        assert set(raw[section]) == set(field.annotation.model_fields), section


def _resolves(path: str) -> bool:
    """``section`` or ``section.key[.key...]`` names a field of the typed params."""
    model: type | None = PipelineParams
    for name in path.split("."):
        fields = getattr(model, "model_fields", {})
        if name not in fields:
            return False
        model = fields[name].annotation
    return True


def test_dvc_stages_name_existing_sections_and_keys():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    named = {p for stage in stages.values() for p in stage.get("params", [])}
    assert named and all(_resolves(p) for p in named), sorted(p for p in named if not _resolves(p))
    assert not _resolves("base.nonsense") and not _resolves("nonsense")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def test_missing_sections_and_keys_take_the_defaults(tmp_path):
    params = load_params(_write(tmp_path, "collect:\n  k: 4\n"))
    assert params.collect.k == 4
    assert params == PipelineParams(collect={"k": 4})
    assert load_params(_write(tmp_path, "")) == PipelineParams()


@pytest.mark.parametrize(
    "text, key",
    [
        ("collect:\n  k: 0\n", "collect.k"),
        ("collect:\n  k: 65\n", "collect.k"),
        ("collect:\n  top_p: 2\n", "collect.top_p"),
        ("collect:\n  top_p: 0\n", "collect.top_p"),
        ("collect:\n  temperature: -1\n", "collect.temperature"),
        ("collect:\n  max_new_tokens: 0\n", "collect.max_new_tokens"),
        ("collect:\n  policy: magic\n", "collect.policy"),
        ("collect:\n  failure_threshold: 1.5\n", "collect.failure_threshold"),
        ("collect:\n  chunk_size: 0\n", "collect.chunk_size"),
        ("collect:\n  colour: red\n", "collect.colour"),
        ("traffic:\n  workloads: [poetry]\n", "traffic.workloads.0"),
        ("traffic:\n  workloads: []\n", "traffic.workloads"),
        ("traffic:\n  train_prompts_per_workload: -1\n", "traffic.train_prompts_per_workload"),
        ("dataset:\n  failure_share: 0\n", "dataset.failure_share"),
        ("dataset:\n  heldout_share: 1\n", "dataset.heldout_share"),
        ("dataset:\n  heldout_share: -0.1\n", "dataset.heldout_share"),
        ("tracker:\n  window: 0\n", "tracker.window"),
        ("tracker:\n  threshold: lots\n", "tracker.threshold"),
        ("extras:\n  a: 1\n", "extras"),
        ("collect: 3\n", "collect"),
    ],
)
def test_bad_value_names_its_key(tmp_path, text, key):
    path = _write(tmp_path, text)
    with pytest.raises(BadInputError) as caught:
        load_params(path)
    message = str(caught.value)
    assert f"invalid params in {str(path)!r}" in message
    assert key in message.splitlines()  # pydantic puts the key on a line of its own


def test_unreadable_file_is_a_bad_input(tmp_path):
    with pytest.raises(BadInputError, match="cannot read params file"):
        load_params(tmp_path / "missing.yaml")
    with pytest.raises(BadInputError, match="cannot read params file"):
        load_params(_write(tmp_path, "collect: [\n"))
