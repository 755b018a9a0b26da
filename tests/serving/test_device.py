"""Device plumbing: every tensor the engine makes for a model is on that model's device.

On this CPU-only machine two guards do the work. Decoding runs under ``torch.device("meta")``
as the default device, so a tensor made without an explicit device (``torch.tensor(ids)``)
lands on ``meta`` and the run fails; and the target's (and each model draft's) ``forward``
is wrapped to check that every tensor it is handed is on its own device. The ``cuda``
cases run the same checks on a GPU, where a stray CPU tensor is a real error; they are
skipped where torch sees none.
"""

from __future__ import annotations

import pytest
import torch

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.base import DraftProposal
from serving.engine.drafters.factory import build_drafter
from serving.engine.drafters.head import HeadDrafter
from serving.engine.drafters.model import ModelDrafter
from serving.engine.drafters.ngram_store import NGramDrafter
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.drafters.suffix import suffix_drafter
from serving.engine.policy import FixedK
from serving.engine.sampling import SamplingParams, make_sampler
from serving.engine.step import speculative_step
from serving.errors import BadInputError
from serving.models.head import DraftHead, head_config_for
from serving.models.tiny import tiny_llama
from serving.models.truncated import first_layers
from serving.target import LoadedTarget

NEW_TOKENS = 24
NO_GPU = not torch.cuda.is_available()
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(NO_GPU, reason="torch sees no CUDA GPU")),
]


def _head(target: LoadedTarget, draft_vocab_size: int | None = None) -> DraftHead:
    torch.manual_seed(0)
    config = head_config_for(target.model, intermediate_size=48, draft_vocab_size=draft_vocab_size)
    vocab_ids = None if draft_vocab_size is None else torch.arange(draft_vocab_size) * 2
    return DraftHead(config, vocab_ids=vocab_ids).eval()


DRAFTERS = {
    "none": lambda target: None,
    "pld": lambda target: PromptLookupDrafter(),
    "ngram": lambda target: NGramDrafter(),
    "suffix": lambda target: suffix_drafter(None),
    "layers": lambda target: ModelDrafter(target.over(first_layers(target.model, 2))),
    "model": lambda target: ModelDrafter(LoadedTarget.of(tiny_llama(seed=1).to(target.device))),
    "head": lambda target: HeadDrafter(_head(target), target),
    "head_reduced": lambda target: HeadDrafter(_head(target, draft_vocab_size=40), target),
}


def _guard(module: torch.nn.Module, seen: list[str]) -> None:
    """Wrap ``module.forward``: fail on any tensor argument off the module's device."""
    device = next(module.parameters()).device
    forward = module.forward

    def checked(*args, **kwargs):
        for name, value in [*enumerate(args), *kwargs.items()]:
            if isinstance(value, torch.Tensor):
                assert value.device == device, (
                    f"{type(module).__name__}.forward got {name!r} on {value.device}, "
                    f"not on its device {device}"
                )
                seen.append(str(name))
        return forward(*args, **kwargs)

    module.forward = checked  # type: ignore[method-assign]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("drafter_name", DRAFTERS)
def test_every_tensor_handed_to_a_model_is_on_its_device(prompt, device, drafter_name):
    model = tiny_llama().to(device)
    target = LoadedTarget.of(model)  # no end-of-sequence ids: decodes to the budget
    plain = SpeculativeDecoder(target).generate(prompt, max_new_tokens=NEW_TOKENS).token_ids
    drafter = DRAFTERS[drafter_name](target)
    seen: list[str] = []
    _guard(model, seen)
    if isinstance(drafter, ModelDrafter):
        _guard(drafter.model.model, seen)
    if isinstance(drafter, HeadDrafter):
        _guard(drafter.step.head, seen)
    decoder = SpeculativeDecoder(
        target, drafter=drafter, policy=FixedK(3) if drafter is not None else None
    )
    assert decoder.device.type == device
    sampled = SamplingParams(temperature=0.8, top_p=0.95, seed=3)
    with torch.device("meta"):  # a tensor made without a device would land here
        greedy = decoder.generate(prompt, max_new_tokens=NEW_TOKENS, mode="detailed")
        first = decoder.generate(prompt, max_new_tokens=NEW_TOKENS, sampling=sampled).token_ids
        second = decoder.generate(prompt, max_new_tokens=NEW_TOKENS, sampling=sampled).token_ids
    assert greedy.token_ids == plain  # greedy speculative output is plain greedy output
    assert first == second  # a seed reproduces on one device
    assert "input_ids" in seen
    if drafter is not None:
        assert greedy.stats.draft_tokens > 0


@pytest.mark.parametrize("device", DEVICES)
def test_a_model_draft_loads_onto_its_targets_device_and_dtype(tmp_path, device):
    tiny_llama(seed=1).save_pretrained(tmp_path / "draft")
    target = LoadedTarget.of(tiny_llama(dtype=torch.bfloat16).to(device))
    drafter = build_drafter(f"model:{tmp_path / 'draft'}", target)
    assert isinstance(drafter, ModelDrafter)
    weight = next(drafter.model.model.parameters())
    assert weight.device.type == device and weight.dtype == torch.bfloat16
    assert drafter.device == weight.device


@pytest.mark.parametrize("device", DEVICES)
def test_a_float32_head_drafts_for_a_bfloat16_target(prompt, device):
    # The head keeps its own dtype; the target's features and embeddings are cast to it,
    # and its predicted features back for the target's output layer.
    target = LoadedTarget.of(tiny_llama(dtype=torch.bfloat16).to(device))
    head = _head(target)
    drafter = HeadDrafter(head, target)
    assert next(drafter.step.head.parameters()).device.type == device
    assert next(drafter.step.head.parameters()).dtype == torch.float32
    result = SpeculativeDecoder(target, drafter=drafter, policy=FixedK(3)).generate(
        prompt, max_new_tokens=NEW_TOKENS
    )
    assert len(result.token_ids) == NEW_TOKENS
    assert result.stats.draft_tokens > 0


def test_a_proposal_moves_with_all_its_tensors():
    proposal = DraftProposal(
        torch.tensor([3, 4]), draft_probs=torch.rand(2, 8), confidence=torch.rand(2)
    )
    assert proposal.to(torch.device("cpu")) is proposal
    moved = proposal.to(torch.device("meta"))
    assert moved.tokens.is_meta and moved.draft_probs is not None and moved.draft_probs.is_meta
    assert moved.confidence is not None and moved.confidence.is_meta


def test_a_sampler_draws_where_it_was_made():
    assert make_sampler().device is None  # greedy never draws
    sampler = make_sampler(SamplingParams(temperature=1.0, seed=0), device="cpu")
    assert sampler.device == torch.device("cpu")
    assert sampler.uniform(3).device == torch.device("cpu")


@pytest.mark.skipif(NO_GPU, reason="torch sees no CUDA GPU")
def test_a_cpu_sampler_is_refused_for_a_cuda_target(prompt):
    target = LoadedTarget.of(tiny_llama().to("cuda"))
    cache = target.new_cache()
    sampler = make_sampler(SamplingParams(temperature=1.0, seed=0))  # on the CPU
    with pytest.raises(BadInputError, match="make_sampler"):
        speculative_step(target, cache, [prompt[0]], None, 0, sampler)
