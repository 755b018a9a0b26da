"""A measured curve written into configs/hardware.yaml under one target: the rest of the
file (its comments too) kept line for line."""

import shutil

import pytest
import yaml

from serving.errors import BadInputError
from serving.hardware import HARDWARE_CONFIG, load_hardware
from tasks.gpu.hardware_yaml import set_target_key


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "hardware.yaml"
    shutil.copy(HARDWARE_CONFIG, path)
    return path


def test_a_curve_replaces_the_old_one_and_its_provenance_comment(config):
    before = config.read_text().splitlines()
    curve = [1.0, 1.01, 1.02, 1.05, 1.1, 1.2, 1.2, 1.3, 1.3, 1.4, 1.4, 1.5, 1.5, 1.6, 1.6, 1.7]
    set_target_key(config, "cuda", "verify_curve", curve, ["measured by a test"])
    after = config.read_text()
    assert yaml.safe_load(after)["targets"]["cuda"]["verify_curve"] == curve
    assert "PROVISIONAL" not in after and "    # measured by a test" in after
    # Every other target reads as before, and the file still loads as a hardware config.
    old, new = yaml.safe_load("\n".join(before))["targets"], yaml.safe_load(after)["targets"]
    assert {k: v for k, v in old.items() if k != "cuda"} == {
        k: v for k, v in new.items() if k != "cuda"
    }
    assert load_hardware(config).targets["cuda"].verify_curve == curve
    # Lines outside the cuda block are untouched.
    assert after.splitlines()[:10] == before[:10] and after.splitlines()[-5:] == before[-5:]


def test_a_missing_key_is_added_and_an_unknown_target_refused(config):
    set_target_key(config, "cuda", "batch_curve", [[1, 1.0], [4, 1.2]], ["a test"])
    assert yaml.safe_load(config.read_text())["targets"]["cuda"]["batch_curve"] == [
        [1, 1.0],
        [4, 1.2],
    ]
    with pytest.raises(BadInputError, match="no target 'tpu'"):
        set_target_key(config, "tpu", "verify_curve", [1.0], [])
