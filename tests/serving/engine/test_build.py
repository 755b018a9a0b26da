"""The one decoder constructor (serving/engine/build.py): plain decoding, a drafter plan, a
cascade plan and a drafter built beforehand, priced with the target's own hardware; a
target whose model is off its hardware target's device is refused before anything is
built."""

from __future__ import annotations

import pytest
from transformers import PreTrainedModel

import serving.engine.build as build_module
from serving.curves import normalise_curve
from serving.engine.build import build_decoder, policy_for
from serving.engine.cascade.build import build_cascade
from serving.engine.cascade.drafter import CascadeDrafter, CascadePolicy
from serving.engine.drafters.model import ModelDrafter
from serving.engine.drafters.plan import PLAIN, CascadePlan, DraftPlan
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.policy import CostAwareK, FixedK, NoDraft, make_policy
from serving.errors import BadInputError
from serving.hardware import engine_target, hardware_target
from serving.target import LoadedTarget

NEW_TOKENS = 48  # the length of conftest's greedy_reference
EOS = 2  # the tiny model's eos id; greedy_reference emits it at index 6


@pytest.fixture(scope="module")
def on_cpu(target: PreTrainedModel) -> LoadedTarget:
    """The tiny target taken as it is on hardware target ``cpu`` (its verify curve)."""
    return LoadedTarget.of(target, hardware=engine_target("cpu"))


def test_plain_decoding(loaded, prompt, greedy_reference):
    decoder = build_decoder(loaded)
    assert decoder.target is loaded and decoder.drafter is None
    assert isinstance(decoder.policy, NoDraft)
    assert decoder.eos_token_ids == frozenset()  # the target's: none, as LoadedTarget.of
    assert decoder.max_context == loaded.context_limit and decoder.relax_lambda == float("inf")
    assert decoder.generate(prompt, max_new_tokens=NEW_TOKENS).token_ids == greedy_reference
    assert build_decoder(loaded, PLAIN).describe() == decoder.describe()


def test_the_targets_eos_ids_unless_given(target, prompt, greedy_reference):
    stops = LoadedTarget.of(target, eos_token_ids=[EOS])
    stop = greedy_reference.index(EOS)
    result = build_decoder(stops).generate(prompt, max_new_tokens=NEW_TOKENS)
    assert result.token_ids == greedy_reference[: stop + 1] and result.stop_reason == "eos"
    to_budget = build_decoder(stops, eos_token_ids=()).generate(prompt, max_new_tokens=NEW_TOKENS)
    assert to_budget.token_ids == greedy_reference and to_budget.stop_reason == "length"
    other = build_decoder(stops, eos_token_ids=[95])
    assert other.eos_token_ids == frozenset({95})


def test_a_drafter_plan(on_cpu, prompt, greedy_reference):
    decoder = build_decoder(on_cpu, DraftPlan.parse("pld:3", policy="fixed", k=3))
    assert isinstance(decoder.drafter, PromptLookupDrafter)
    assert decoder.drafter.describe()["kind"] == "prompt_lookup"
    assert decoder.policy.describe() == FixedK(3).describe()
    result = decoder.generate(prompt, max_new_tokens=NEW_TOKENS)
    assert result.token_ids == greedy_reference and result.stats.draft_tokens > 0
    layers = build_decoder(on_cpu, DraftPlan.parse("layers:2", policy="adaptive", k=4))
    assert isinstance(layers.drafter, ModelDrafter)
    assert layers.drafter.model.config.num_hidden_layers == 2
    assert layers.policy.describe()["name"].startswith("adaptive")
    assert layers.generate(prompt, max_new_tokens=NEW_TOKENS).token_ids == greedy_reference


def test_a_plans_policy_is_priced_with_its_targets_hardware(target, on_cpu):
    plan = DraftPlan.parse("pld", policy="cost", k=6)
    policy = policy_for(plan, on_cpu)
    assert isinstance(policy, CostAwareK) and policy.k_max == 6
    cpu = engine_target("cpu").curve
    assert policy.verify_curve == normalise_curve(cpu)
    made = make_policy("cost", 6, verify_curve=cpu)
    assert isinstance(made, CostAwareK) and made.verify_curve == policy.verify_curve
    stock = LoadedTarget.of(target, hardware=engine_target("cpu-stock"))
    priced_for_stock = policy_for(plan, stock)
    assert isinstance(priced_for_stock, CostAwareK)
    assert priced_for_stock.verify_curve != policy.verify_curve
    decoder = build_decoder(on_cpu, plan)
    assert isinstance(decoder.policy, CostAwareK)
    assert decoder.policy.verify_curve == policy.verify_curve


def test_a_cascade_plan(on_cpu, prompt, greedy_reference):
    plan = CascadePlan.parse("pld:2,layers:2", k=6)
    decoder = build_decoder(on_cpu, plan)
    cascade = decoder.drafter
    assert isinstance(cascade, CascadeDrafter) and isinstance(decoder.policy, CascadePolicy)
    assert decoder.policy.cascade is cascade
    assert [stage.name for stage in cascade.stages] == ["pld:2", "layers:2"]
    assert cascade.k_max == 6 and cascade.curve == normalise_curve(on_cpu.hardware.curve)
    assert cascade.predictor is None
    assert decoder.generate(prompt, max_new_tokens=NEW_TOKENS).token_ids == greedy_reference


def test_a_given_drafter_is_used_as_it_is(on_cpu, prompt, greedy_reference):
    mine = PromptLookupDrafter(max_ngram=2)
    plan = DraftPlan.parse("pld:2", policy="fixed", k=4)
    decoder = build_decoder(on_cpu, plan, drafter=mine)
    assert decoder.drafter is mine and decoder.policy.describe() == FixedK(4).describe()
    assert decoder.generate(prompt, max_new_tokens=NEW_TOKENS).token_ids == greedy_reference
    # None: a plan whose drafter is not there (a champion decoding plainly) decodes plainly.
    plain = build_decoder(on_cpu, plan, drafter=None)
    assert plain.drafter is None and isinstance(plain.policy, NoDraft)
    cascade_plan = CascadePlan.parse("pld:2")
    cascade = build_cascade(cascade_plan, on_cpu)
    assert build_decoder(on_cpu, cascade_plan, drafter=cascade).drafter is cascade
    with pytest.raises(BadInputError, match="a cascade plan needs a cascade drafter"):
        build_decoder(on_cpu, cascade_plan, drafter=mine)


def test_relaxed_verification_and_the_context_limit_pass_through(on_cpu, prompt):
    plan = DraftPlan.parse("pld", policy="fixed", k=4)
    decoder = build_decoder(on_cpu, plan, relax_lambda=0.5, max_context=32)
    assert decoder.relaxed and decoder.relax_lambda == 0.5 and decoder.max_context == 32
    assert decoder.describe()["relax_lambda"] == 0.5
    with pytest.raises(BadInputError, match="exceeds the model's context of 32 tokens"):
        decoder.stream(prompt, max_new_tokens=30)


@pytest.mark.parametrize(
    "plan",
    [PLAIN, DraftPlan.parse("layers:2", policy="fixed", k=3), CascadePlan.parse("pld,layers:2")],
    ids=["plain", "drafter", "cascade"],
)
def test_a_model_off_its_hardware_targets_device_is_refused_first(target, monkeypatch, plan):
    def must_not_build(*args, **kwargs):
        raise AssertionError("a drafter was built for a misplaced target")

    monkeypatch.setattr(build_module, "build_drafter", must_not_build)
    monkeypatch.setattr(build_module, "build_cascade", must_not_build)
    on_cuda = LoadedTarget.of(target, hardware=hardware_target("cuda"))
    with pytest.raises(BadInputError) as excinfo:
        build_decoder(on_cuda, plan)
    assert str(excinfo.value) == (
        "the model is on cpu, but hardware target 'cuda' runs on 'cuda'; load it with "
        "load_target(source, engine_target('cuda'))"
    )


def test_a_decoder_is_copied_onto_another_target(loaded, on_cpu):
    decoder = build_decoder(on_cpu, DraftPlan.parse("pld", policy="fixed", k=2))
    copied = decoder.on(loaded)
    assert copied.target is loaded and decoder.target is on_cpu
    assert copied.drafter is decoder.drafter and copied.policy is decoder.policy
    assert copied.eos_token_ids == decoder.eos_token_ids
    assert copied.device == loaded.device
