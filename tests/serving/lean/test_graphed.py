"""The GPU's lean step (serving/lean/graphed.py): the same fixed-shape torch code that a
GPU captures as CUDA graphs, run eagerly here on the CPU, against transformers' forward;
the capture itself on a GPU where torch sees one."""

from __future__ import annotations

from typing import cast

import pytest
import torch
from transformers import DynamicCache

from serving.curves import BatchLimits, PassCost
from serving.engine.batch.batch import decode_together
from serving.engine.batch.ragged import use_ragged_attention
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.factory import build_drafter
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.kv import rewind
from serving.engine.policy import FixedK
from serving.errors import BadInputError, SpecOpsError
from serving.lean import graphed
from serving.lean.graphed import GraphedCache, GraphedStep, graphs_wanted
from serving.models.fused import fuse_projections
from serving.models.tiny import tiny_llama
from serving.target import LoadedTarget

PROMPTS = [[1, 5, 17, 42, 8, 5, 17, 42, 33, 9, 5, 17], [3, 4, 5, 6, 3, 4, 5, 6, 3, 4], [7]]
NO_GPU = not torch.cuda.is_available()


def _target(device: str = "cpu", *, fused: bool = False, capture: bool = False) -> LoadedTarget:
    """A tiny target on the graphed step (no end-of-sequence ids: it decodes to its budget)."""
    model = tiny_llama(num_layers=3, max_positions=512)
    cast(torch.nn.Module, model).to(device)  # in place: every parameter moves
    if fused:
        fuse_projections(model)
    return LoadedTarget.of(model, step=GraphedStep(model, capture=capture))


def _reference(model: LoadedTarget, ids: list[int], cuts: list[int]) -> list[torch.Tensor]:
    """transformers' forward over ``ids`` in passes ending at ``cuts`` (a DynamicCache)."""
    cache, out, start = DynamicCache(config=model.config), [], 0
    for cut in cuts:
        block = torch.tensor(ids[start:cut], device=model.device)[None]
        out.append(model(input_ids=block, past_key_values=cache, use_cache=True).logits[0])
        start = cut
    return out


@pytest.mark.parametrize("fused", [False, True])
def test_passes_match_transformers_forward_at_every_block_size(fused):
    model = _target(fused=fused)
    ids = [(7 * i + 3) % 96 for i in range(40)]
    cuts = [9, 10, 14, 15, 23, 24, 40]  # a prefill, then blocks of 1, 4, 1, 8, 1 and 16
    with torch.inference_mode():
        expected = _reference(model, ids, cuts)
        cache, start = model.new_cache(), 0
        assert isinstance(cache, GraphedCache)
        for cut, want in zip(cuts, expected, strict=True):
            block = torch.tensor(ids[start:cut])[None]
            got = model(input_ids=block, past_key_values=cache, use_cache=True).logits[0]
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            start = cut
        assert cache.get_seq_length() == 40


def test_a_rewind_only_lowers_the_length_and_stale_entries_never_count():
    model = _target()
    ids = [(5 * i + 1) % 96 for i in range(20)]
    with torch.inference_mode():
        cache = model.new_cache()
        model(input_ids=torch.tensor(ids[:12])[None], past_key_values=cache)
        model(input_ids=torch.tensor([9, 9, 9, 9])[None], past_key_values=cache)  # rejected
        rewind(cache, 12)
        got = model(input_ids=torch.tensor(ids[12:])[None], past_key_values=cache).logits[0]
        want = _reference(model, ids, [12, 20])[1]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(SpecOpsError, match="cannot crop 30 tokens"):
        cache.crop(-30)


def _greedy(target: LoadedTarget, prompt, drafter=None, policy=None, new=24):
    decoder = SpeculativeDecoder(target, drafter=drafter, policy=policy)
    return decoder.generate(prompt, max_new_tokens=new).token_ids


def test_speculative_output_equals_plain_output_with_every_draft_kind():
    model = _target()
    for prompt in PROMPTS:
        plain = _greedy(model, prompt)
        for drafter, policy in [
            (PromptLookupDrafter(), FixedK(4)),
            (build_drafter("layers:1", model), FixedK(3)),
        ]:
            assert _greedy(model, prompt, drafter, policy) == plain
    draft = build_drafter("layers:1", model).model  # type: ignore[union-attr]
    # its own step over the shared layers
    assert isinstance(draft.step, GraphedStep) and draft.step is not model.step


def test_requests_taking_turns_get_what_each_gets_alone():
    model = _target()
    alone = [_greedy(model, prompt) for prompt in PROMPTS]
    decoders = [SpeculativeDecoder(model) for _ in PROMPTS]
    streams = [d.stream(p, max_new_tokens=24) for d, p in zip(decoders, PROMPTS, strict=True)]
    outputs: list[list[int]] = [[] for _ in PROMPTS]
    live = set(range(len(PROMPTS)))
    while live:  # one step of each in turn: the resident request changes every pass
        for index in sorted(live):
            event = next(streams[index], None)
            if event is None:
                live.discard(index)
            else:
                outputs[index].append(event.token_id)
    assert outputs == alone


def test_packed_batches_equal_each_request_alone():
    model = _target()
    use_ragged_attention(model.model)
    alone = [_greedy(model, p) for p in PROMPTS]
    decodings = [
        SpeculativeDecoder(model, drafter=drafter, policy=policy).begin(p, max_new_tokens=24)
        for p in PROMPTS
        for drafter, policy in [
            (None, None),
            (PromptLookupDrafter(), FixedK(4)),
            (build_drafter("layers:1", model), FixedK(3)),
        ]
    ]
    limits = BatchLimits(max_sequences=4, max_tokens_per_pass=16)
    results = decode_together(decodings, model, limits=limits, cost=PassCost())
    assert [r.token_ids for r in results] == [a for a in alone for _ in range(3)]


def test_the_buffers_grow_past_their_first_capacity(monkeypatch):
    monkeypatch.setattr(graphed, "INITIAL_CAPACITY", 16)
    model = _target()
    step = model.step
    assert isinstance(step, GraphedStep) and step.capacity == 16
    prompt = PROMPTS[0]
    plain = _greedy(model, prompt, new=40)
    assert step.capacity >= len(prompt) + 40
    # DynamicCache passes
    transformers_only = LoadedTarget.of(tiny_llama(num_layers=3, max_positions=512))
    assert _greedy(transformers_only, prompt, new=40) == plain
    cache = step.new_cache()
    cache.length = 510
    with pytest.raises(SpecOpsError, match="a pass to 513 tokens runs past the model's 512"):
        step.forward(torch.tensor([1, 2, 3]), [cache], [3])
    assert cache.length == 510


def test_the_graphs_setting_is_checked(monkeypatch):
    monkeypatch.setenv("SPECOPS_CUDA_GRAPHS", "maybe")
    with pytest.raises(BadInputError, match="SPECOPS_CUDA_GRAPHS='maybe'"):
        graphs_wanted(torch.device("cuda"))
    monkeypatch.setenv("SPECOPS_CUDA_GRAPHS", "on")
    assert not graphs_wanted(torch.device("cpu"))
    with pytest.raises(SpecOpsError, match="CUDA graphs need a CUDA device"):
        GraphedStep(tiny_llama(), capture=True)


def test_another_architecture_is_named():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(SpecOpsError, match="'gpt2' is not Llama's"):
        GraphedStep(model)


@pytest.mark.skipif(NO_GPU, reason="torch sees no CUDA GPU")
@pytest.mark.parametrize("fused", [False, True])
def test_captured_passes_decode_exactly_on_the_gpu(fused):
    model = _target("cuda", fused=fused, capture=True)
    step = model.step
    assert isinstance(step, GraphedStep)
    for prompt in PROMPTS:
        plain = _greedy(model, prompt)
        for drafter, policy in [
            (PromptLookupDrafter(), FixedK(4)),
            (build_drafter("layers:1", model), FixedK(3)),
        ]:
            assert _greedy(model, prompt, drafter, policy) == plain
    assert 1 in step.graphs and step.graphs[1].graph is not None
    eager = _target("cuda", fused=fused, capture=False)
    eager.model.load_state_dict(model.model.state_dict())
    assert [_greedy(eager, p) for p in PROMPTS] == [_greedy(model, p) for p in PROMPTS]


def test_every_tensor_is_made_on_the_model_device():
    # As tests/serving/test_device.py does: a tensor made without a device lands on meta.
    model = _target()
    plain = _greedy(model, PROMPTS[0])
    with torch.device("meta"):
        assert _greedy(model, PROMPTS[0], PromptLookupDrafter(), FixedK(4)) == plain
