"""The loaded target (serving/target.py): what it derives from its model, where its passes
go (the step's caches to the step, any other to transformers' forward), the targets
derived from it, the device check, and :func:`prepare_target` on the tiny model."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import DynamicCache, PreTrainedModel

from serving.errors import BadInputError, SpecOpsError
from serving.hardware import engine_target, hardware_target
from serving.lean.cache import LeanCache, Length
from serving.lean.install import make_step
from serving.lean.step import LeanOutput, LeanStep
from serving.models.kernels import apply_kernels
from serving.models.tiny import tiny_llama
from serving.models.truncated import first_layers
from serving.target import (
    DEFAULT_TARGET,
    LoadedTarget,
    check_placed,
    dynamic_cache,
    eos_ids,
    prepare_target,
)

IDS = torch.tensor([[1, 5, 17, 42, 8, 5, 17, 42, 33, 9, 5, 17]])


def _shaped(seed: int = 0) -> PreTrainedModel:
    """A tiny Llama of shapes every kernel family and the lean step take (as
    tests/serving/lean/models.py)."""
    return tiny_llama(seed=seed, hidden_size=64, intermediate_size=128)


def _forbid_transformers_layers(model: PreTrainedModel) -> None:
    def raising(*args, **kwargs):
        raise AssertionError("transformers' decoder layer ran")

    for layer in model.model.layers:
        layer.forward = raising


def _lean(seed: int = 0) -> LoadedTarget:
    """A tiny target on the CPU's lean step (oneDNN, fused), as load_target makes one."""
    model = _shaped(seed)
    apply_kernels(model, "onednn", fuse=True)
    step = make_step(model, "on")
    assert isinstance(step, LeanStep)
    return LoadedTarget.of(model, hardware=engine_target("cpu"), step=step)


class Recording:
    """A step that runs another and records each pass it is handed."""

    def __init__(self, step: LeanStep) -> None:
        self.step = step
        self.cache_type = step.cache_type
        self.passes: list[tuple[list[int], int, bool]] = []  # (rows, keep, want_hidden)

    def new_cache(self) -> Length:
        return self.step.new_cache()

    def forward(
        self,
        ids: torch.Tensor,
        caches: Any,
        rows: Sequence[int],
        *,
        keep: int = 0,
        want_hidden: bool = False,
    ) -> LeanOutput:
        self.passes.append((list(rows), keep, want_hidden))
        return self.step.forward(ids, caches, rows, keep=keep, want_hidden=want_hidden)


# ------------------------------------------------------------------------- of() defaults


def test_of_takes_a_model_as_it_is(target):
    loaded = LoadedTarget.of(target)
    assert loaded.model is target and loaded.tokenizer is None and loaded.source == ""
    assert loaded.hardware == hardware_target("cpu-stock") and loaded.name == "cpu-stock"
    assert loaded.eos_token_ids == ()  # decoding runs to its budget
    assert loaded.step is None and loaded.kernels == "stock"
    assert (loaded.device, loaded.dtype) == (torch.device("cpu"), torch.float32)
    assert loaded.context_limit == target.config.max_position_embeddings == 256
    assert loaded.config is target.config
    assert (loaded.vocab_size, loaded.hidden_size) == (96, 32)
    assert isinstance(loaded.new_cache(), DynamicCache)
    assert DEFAULT_TARGET == "smollm2"


def test_of_keeps_what_it_is_given(target):
    tokenizer = SimpleNamespace(eos_token_id=3)
    cpu = engine_target("cpu")
    loaded = LoadedTarget.of(target, tokenizer, hardware=cpu, eos_token_ids=[2, 7])
    assert loaded.tokenizer is tokenizer and loaded.hardware is cpu and loaded.name == "cpu"
    assert loaded.eos_token_ids == (2, 7)
    # The kernels are read from the model's layers, not from the hardware target's name.
    assert loaded.kernels == "stock"
    packed = tiny_llama()
    apply_kernels(packed, "onednn")
    assert LoadedTarget.of(packed).kernels == "onednn"
    quantised = _shaped()
    apply_kernels(quantised, "int4")
    assert LoadedTarget.of(quantised).kernels == "int4"


def test_a_half_precision_target_reports_its_dtype():
    loaded = LoadedTarget.of(tiny_llama(dtype=torch.bfloat16))
    assert loaded.dtype == torch.bfloat16 and loaded.device.type == "cpu"


def test_eos_ids_are_the_models_and_the_tokenizers():
    model = tiny_llama()
    assert eos_ids(model, None) == (2,)
    assert eos_ids(model, SimpleNamespace(eos_token_id=5)) == (2, 5)
    model.generation_config.eos_token_id = [7, 2]
    assert eos_ids(model, SimpleNamespace(eos_token_id=2)) == (2, 7)
    model.generation_config.eos_token_id = None
    assert eos_ids(model, SimpleNamespace(eos_token_id=None)) == ()


def test_a_sliding_window_model_gets_no_rewindable_cache():
    config = SimpleNamespace(model_type="mistral", sliding_window=4, use_sliding_window=True)
    with pytest.raises(SpecOpsError, match="'mistral' uses sliding-window attention"):
        dynamic_cache(config)


# ------------------------------------------------------------------------- pass routing


def test_without_a_step_every_pass_is_transformers_forward(target):
    loaded = LoadedTarget.of(target)
    with torch.inference_mode():
        cache = loaded.new_cache()
        out = loaded(input_ids=IDS, past_key_values=cache, use_cache=True)
        want = target(input_ids=IDS, past_key_values=DynamicCache(config=target.config))
        assert torch.equal(out.logits, want.logits)
        assert cache.get_seq_length() == IDS.shape[1]
        assert torch.equal(loaded(IDS).logits, target(IDS).logits)  # positional, no cache


def test_passes_over_the_steps_caches_run_the_step_and_others_transformers():
    lean = _lean()
    recording = Recording(lean.step)  # type: ignore[arg-type]
    target = lean.with_step(recording)
    twin = _lean()  # the same weights through transformers' forward
    with torch.inference_mode():
        cache = target.new_cache()
        assert isinstance(cache, LeanCache)
        out = target(input_ids=IDS, past_key_values=cache, use_cache=True, logits_to_keep=1)
        assert recording.passes == [([IDS.shape[1]], 1, False)]
        assert out.logits.shape == (1, 1, 96) and out.past_key_values is cache
        assert cache.get_seq_length() == IDS.shape[1]
        hidden = target(
            input_ids=IDS[:, :2], past_key_values=cache, output_hidden_states=True
        ).hidden_states
        assert recording.passes[-1] == ([2], 0, True) and hidden[-1].shape == (1, 2, 64)
        # A DynamicCache (teacher forcing, a draft's own cache) goes to transformers.
        other = DynamicCache(config=target.config)
        plain = target(input_ids=IDS, past_key_values=other, use_cache=True)
        assert len(recording.passes) == 2 and other.get_seq_length() == IDS.shape[1]
        reference = twin.model(input_ids=IDS).logits
    torch.testing.assert_close(plain.logits, reference, rtol=0, atol=1e-4)
    torch.testing.assert_close(out.logits[0, -1], reference[0, -1], rtol=0, atol=1e-4)


def test_a_step_pass_never_reaches_transformers_layers():
    target = _lean()
    _forbid_transformers_layers(target.model)
    with torch.inference_mode():
        target(input_ids=IDS, past_key_values=target.new_cache())
        with pytest.raises(AssertionError, match="decoder layer ran"):
            target(input_ids=IDS)  # no cache of the step's: transformers' path


def test_the_step_takes_one_row_of_input_ids():
    target = _lean()
    with torch.inference_mode(), pytest.raises(BadInputError, match=r"input_ids \[1, rows\]"):
        target(input_ids=torch.ones(2, 3, dtype=torch.int64), past_key_values=target.new_cache())


# ---------------------------------------------------------------------- derived targets


def test_over_serves_a_draft_like_its_target():
    lean = _lean()
    tokenizer = SimpleNamespace(eos_token_id=2)
    target = LoadedTarget(
        model=lean.model,
        hardware=lean.hardware,
        tokenizer=tokenizer,  # type: ignore[arg-type]
        source="somewhere",
        eos_token_ids=(2,),
        step=lean.step,
    )
    draft = target.over(first_layers(target.model, 2))
    assert draft.hardware is target.hardware and draft.tokenizer is tokenizer
    assert (draft.source, draft.eos_token_ids, draft.kernels) == ("somewhere", (2,), "onednn")
    assert isinstance(draft.step, LeanStep) and draft.step is not target.step
    assert len(draft.step.layers) == 2  # its own step over the shared layers
    assert isinstance(draft.new_cache(), LeanCache)
    assert draft.config.num_hidden_layers == 2
    assert target.over(first_layers(target.model, 2), lean=False).step is None
    plain = LoadedTarget.of(tiny_llama())
    assert plain.over(first_layers(plain.model, 2)).step is None  # no step: none for it


def test_with_step_swaps_the_step_and_nothing_else():
    lean = _lean()
    step = lean.step
    recording = Recording(step)  # type: ignore[arg-type]
    swapped = lean.with_step(recording)
    assert swapped is not lean and swapped.step is recording and lean.step is step
    assert swapped.model is lean.model and swapped.hardware is lean.hardware
    assert (swapped.kernels, swapped.device, swapped.dtype) == (
        lean.kernels,
        lean.device,
        lean.dtype,
    )
    without = lean.with_step(None)
    assert without.step is None and isinstance(without.new_cache(), DynamicCache)


def test_a_target_off_its_hardware_targets_device_is_refused_naming_it(target):
    on_cuda = LoadedTarget.of(target, hardware=hardware_target("cuda"))
    with pytest.raises(BadInputError) as excinfo:
        check_placed(on_cuda)
    assert str(excinfo.value) == (
        "the model is on cpu, but hardware target 'cuda' runs on 'cuda'; load it with "
        "load_target(source, engine_target('cuda'))"
    )
    check_placed(LoadedTarget.of(target, hardware=engine_target("cpu")))  # where it runs


# ---------------------------------------------------------------------- prepare_target


@pytest.mark.parametrize(
    ("hardware", "lean"),
    [("cpu", "on"), ("cpu", "off"), ("cpu-int4", "on"), ("cpu-int8", "off"), ("cpu-stock", "auto")],
)
def test_prepare_target_gives_the_logits_of_kernels_and_step_applied_by_hand(hardware, lean):
    """What a loader did before the target object existed — kernels applied (fused for the
    lean step), the step installed — gives the same logits as the prepared target."""
    tokenizer = SimpleNamespace(eos_token_id=5)
    chosen = engine_target(hardware)
    model = _shaped()
    prepared = prepare_target(
        model,
        chosen,
        tokenizer,  # type: ignore[arg-type]
        source="tiny",
        lean_mode=lean,
    )
    on_step = lean != "off" and chosen.kernels != "stock"
    assert prepared.model is model and prepared.hardware is chosen and prepared.name == hardware
    assert prepared.kernels == chosen.kernels and prepared.source == "tiny"
    assert prepared.tokenizer is tokenizer and prepared.eos_token_ids == (2, 5)
    assert isinstance(prepared.step, LeanStep) if on_step else prepared.step is None
    by_hand = _shaped()
    apply_kernels(by_hand, chosen.kernels, fuse=on_step)
    step = make_step(by_hand, "on") if on_step else None
    reference = LoadedTarget.of(by_hand, step=step)
    with torch.inference_mode():
        got = prepared(input_ids=IDS, past_key_values=prepared.new_cache()).logits
        want = reference(input_ids=IDS, past_key_values=reference.new_cache()).logits
    assert torch.equal(got, want)
