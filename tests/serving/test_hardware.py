from __future__ import annotations

import pytest

from serving.errors import BadInputError
from serving.hardware import HARDWARE_CONFIG, hardware_target, load_hardware


def test_shipped_config_has_the_cpu_target():
    cpu = hardware_target("cpu")
    assert cpu.device == "cpu"
    assert cpu.verify_curve[0] == 1.0


def test_unknown_target_names_the_value():
    with pytest.raises(BadInputError, match="unknown hardware target 'tpu'"):
        hardware_target("tpu")


def test_bad_config_fails_at_load_with_the_key(tmp_path):
    path = tmp_path / "hardware.yaml"
    path.write_text("targets:\n  cpu:\n    verify_curve: [1.0, -2.0]\n")
    with pytest.raises(BadInputError, match="verify_curve"):
        load_hardware(path)
    path.write_text("targets:\n  cpu:\n    verify_curve: [1.0]\n    colour: red\n")
    with pytest.raises(BadInputError, match="colour"):
        load_hardware(path)


def test_config_file_is_where_the_code_looks():
    assert HARDWARE_CONFIG.name == "hardware.yaml" and HARDWARE_CONFIG.is_file()
