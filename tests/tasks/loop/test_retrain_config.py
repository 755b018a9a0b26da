import pytest

from serving.errors import BadInputError
from serving.hardware import hardware_target
from tasks.loop.retrain_config import FamilySettings, load_retrain_config


def test_the_shipped_config_gives_cpu_a_head_under_ten_minutes_that_drafts_4_deep():
    config = load_retrain_config()
    cpu = config.target(hardware_target("cpu"))
    assert cpu.families == ["head"]  # the first-layers LoRA draft left the loop on cpu
    assert cpu.family("head").budget_seconds <= 600
    assert cpu.family("head").k == cpu.family("head").settings["depths"] == 4
    assert cpu.threads == 1
    assert config.target(hardware_target("cuda")).family("lora").settings["quantize"] == "4bit"


def test_a_target_not_listed_trains_no_learned_challenger():
    assert load_retrain_config().target(hardware_target("cpu-stock")).families == []


def test_budgets_can_be_overridden_and_bad_ones_are_named():
    cpu = load_retrain_config().target(hardware_target("cpu")).with_budgets({"head": 30})
    assert cpu.family("head").budget_seconds == 30
    assert cpu.family("lora").budget_seconds == 300
    with pytest.raises(BadInputError, match="unknown families"):
        load_retrain_config().target(hardware_target("cpu")).with_budgets({"medusa": 30})
    with pytest.raises(BadInputError, match="> 0"):
        load_retrain_config().target(hardware_target("cpu")).with_budgets({"head": 0})


def test_a_family_listed_without_settings_is_refused(tmp_path):
    path = tmp_path / "retrain.yaml"
    path.write_text("targets:\n  cpu:\n    families: [head]\n")
    with pytest.raises(BadInputError, match="no settings"):
        load_retrain_config(path)


def test_a_step_bound_is_optional_and_kept_when_budgets_change():
    cpu = load_retrain_config().target(hardware_target("cpu"))
    assert cpu.family("head").max_steps is None  # the shipped config: time budgets only
    bounded = cpu.model_copy(
        update={"head": cpu.family("head").model_copy(update={"max_steps": 20})}
    ).with_budgets({"head": 60})
    assert (bounded.family("head").max_steps, bounded.family("head").budget_seconds) == (20, 60)
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        FamilySettings(budget_seconds=1, max_steps=0)
