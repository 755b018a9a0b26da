"""A LoRA draft stored as its adapter: rebuilt over the target's own first layers, merged
exactly as training merged it, following the target's kernels, refused when it does not
fit the target."""

from __future__ import annotations

import json

import pytest
import torch

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.base import DraftRequest
from serving.engine.drafters.factory import build_drafter
from serving.engine.drafters.model import ModelDrafter
from serving.engine.policy import FixedK
from serving.engine.sampling import make_sampler
from serving.errors import ModelSourceError
from serving.hardware import engine_target
from serving.models.kernels import apply_kernels
from serving.models.lora import BASE_FILE, fp32_first_layers, load_lora_draft
from serving.models.quantized import QuantisedKernelsUnavailable, check_kernels
from serving.models.tiny import tiny_llama
from serving.target import LoadedTarget, prepare_target
from tasks.train.distill_model import base_draft, merge_lora


def _state(model) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def _training_merge(adapter, target, layers: int = 2):
    """What a LoRA run writes to ``model/``: the adapter merged into a fresh fp32 base."""
    return merge_lora(adapter, base_draft(target, layers=layers, draft_model=None)).eval()


def test_a_stored_adapter_loads_as_the_merge_training_wrote(target, lora_adapter, tmp_path):
    adapter = lora_adapter(target, tmp_path / "adapter")
    before = _state(target)
    draft = load_lora_draft(adapter, target)
    expected = _state(_training_merge(adapter, target))
    assert draft.config.num_hidden_layers == 2
    assert _state(draft).keys() == expected.keys()
    for name, tensor in _state(draft).items():
        assert torch.equal(tensor, expected[name]), name
    after = _state(target)  # the target is read, never modified ...
    assert all(torch.equal(before[name], after[name]) for name in before)
    ours = {id(p) for p in target.parameters()}  # ... and shares nothing with the draft
    assert not ours & {id(p) for p in draft.parameters()}


def test_its_drafter_proposes_what_the_merged_model_proposes(
    target, loaded, prompt, greedy_reference, lora_adapter, tmp_path
):
    adapter = lora_adapter(target, tmp_path / "adapter")
    stored = build_drafter(f"lora:{adapter}", loaded)
    merged = ModelDrafter(LoadedTarget.of(_training_merge(adapter, target)))
    request = DraftRequest(tokens=list(prompt), k=6, sampler=make_sampler(temperature=0.0))
    for drafter in (stored, merged):
        drafter.begin(list(prompt))
    assert torch.equal(stored.propose(request).tokens, merged.propose(request).tokens)
    decoder = SpeculativeDecoder(loaded, drafter=stored, policy=FixedK(4))
    out = decoder.generate(prompt, max_new_tokens=len(greedy_reference))
    assert out.token_ids == greedy_reference  # the target verifies: lossless whatever it drafts
    assert out.stats.draft_tokens > 0


def _rewrite_base(adapter, **changes) -> None:
    path = adapter / BASE_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layers": 4}, r"first 4 layers .* this target has 4 layers \(layers:N needs N < 4\)"),
        ({"hidden_size": 64}, "hidden_size=64, but this target has hidden_size=32"),
        ({"vocab_size": 49152}, "vocab_size=49152, but this target has vocab_size=96"),
        ({"layers": 0}, f"bad {BASE_FILE}"),
    ],
    ids=["too-many-layers", "hidden-size", "vocabulary", "bad-base-file"],
)
def test_an_adapter_that_does_not_fit_the_target_is_refused(
    target, loaded, lora_adapter, tmp_path, change, message
):
    adapter = lora_adapter(target, tmp_path / "adapter")
    _rewrite_base(adapter, **change)
    with pytest.raises(ModelSourceError, match=message):
        build_drafter(f"lora:{adapter}", loaded)


def test_an_adapter_of_a_wider_target_is_refused_naming_the_width(lora_adapter, tmp_path):
    wide = tiny_llama(hidden_size=64)
    adapter = lora_adapter(wide, tmp_path / "adapter")
    with pytest.raises(
        ModelSourceError, match="hidden_size=64, but this target has hidden_size=32"
    ):
        load_lora_draft(adapter, tiny_llama())


def test_a_folder_without_its_base_or_adapter_is_refused(target, lora_adapter, tmp_path):
    adapter = lora_adapter(target, tmp_path / "adapter")
    (adapter / BASE_FILE).unlink()
    with pytest.raises(ModelSourceError, match=f"{BASE_FILE} is missing; ship its merged model"):
        load_lora_draft(adapter, target)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelSourceError, match=r"adapter_config\.json is missing"):
        load_lora_draft(tmp_path / "empty", target)


@pytest.mark.parametrize("kernels", ["onednn", "int8", "int4"])
def test_on_a_packed_or_quantised_target_the_base_comes_from_its_folder(
    kernels, lora_adapter, tmp_path
):
    if kernels != "onednn":
        try:
            check_kernels(kernels)
        except QuantisedKernelsUnavailable as error:
            pytest.skip(str(error))
    folder = tmp_path / "target"
    stock = tiny_llama()
    stock.save_pretrained(folder)
    adapter = lora_adapter(stock, tmp_path / "adapter")
    packed = load_target_without_tokenizer(folder, kernels)
    assert packed.kernels == kernels
    drafter = build_drafter(f"lora:{adapter}", packed)
    # The fp32 merge of training, then the target's kernels: what a model:weights draft of
    # that merge gets on this target.
    expected = _training_merge(adapter, stock)
    apply_kernels(expected, kernels, exact=False)
    ids = torch.tensor([[1, 5, 17, 42, 8, 5]])
    with torch.inference_mode():
        assert torch.equal(drafter.model(ids).logits, expected(ids).logits)
    assert type(drafter.model.model.lm_head) is type(expected.lm_head)


# The hardware target of each kernel family (configs/hardware.yaml).
HARDWARE = {"onednn": "cpu", "int8": "cpu-int8", "int4": "cpu-int4"}


def load_target_without_tokenizer(folder, kernels: str) -> LoadedTarget:
    """The model saved in ``folder`` made the target of ``kernels``' hardware target, as
    ``load_target`` makes it (without the lean step)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    hardware = engine_target(HARDWARE[kernels])
    return prepare_target(model, hardware, source=str(folder), lean_mode="off")


def test_a_packed_target_without_its_own_folder_is_refused(tmp_path):
    packed = tiny_llama()
    apply_kernels(packed, "onednn")
    with pytest.raises(ModelSourceError, match=r"its model folder .* is not there"):
        fp32_first_layers(packed, 2)
    tiny_llama(seed=2).save_pretrained(tmp_path / "another")
    packed.config._name_or_path = str(tmp_path / "another")  # another model's folder
    with pytest.raises(ModelSourceError, match="not the loaded target's"):
        fp32_first_layers(packed, 2)
