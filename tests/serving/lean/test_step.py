"""The lean step against transformers' forward, and its rows against one-token passes."""

from __future__ import annotations

import pytest
import torch

from serving.engine.kv import rewind
from serving.lean.cache import LeanCache
from serving.target import LoadedTarget
from tests.serving.lean.models import KERNELS, tiny_target

# fp32 (oneDNN): the same arithmetic up to summation order. The quantised kernels round
# every matmul input to bfloat16, so an ulp of difference upstream can move a rounding;
# their tolerance is that of a bfloat16 rounding carried through 4 layers.
TOLERANCE = {"onednn": 1e-4, "int8": 0.05, "int4": 0.05}


def _logits(target: LoadedTarget, ids: torch.Tensor, splits: list[int]) -> torch.Tensor:
    cache = target.new_cache()
    parts, start = [], 0
    for size in splits:
        out = target(
            input_ids=ids[None, start : start + size], past_key_values=cache, use_cache=True
        )
        parts.append(out.logits[0])
        start += size
    return torch.cat(parts)


@pytest.mark.parametrize("kernels", KERNELS)
def test_lean_logits_match_transformers_forward(kernels):
    lean, reference = tiny_target(kernels), tiny_target(kernels, lean=False)
    ids = torch.randint(3, 96, (40,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = _logits(reference, ids, [30, 1, 4, 5])
        got = _logits(lean, ids, [30, 1, 4, 5])
    assert isinstance(lean.new_cache(), LeanCache)
    scale = want.abs().max()
    assert (got - want).abs().max() / scale < TOLERANCE[kernels]
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9


@pytest.mark.parametrize("kernels", KERNELS)
def test_every_row_of_a_pass_equals_its_one_token_pass_bit_for_bit(kernels):
    target = tiny_target(kernels)
    ids = torch.randint(3, 96, (48,), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        cache = target.new_cache()
        target(input_ids=ids[None, :32], past_key_values=cache)
        singles = torch.cat(
            [
                target(input_ids=ids[None, 32 + i : 33 + i], past_key_values=cache).logits[0]
                for i in range(16)
            ]
        )
        for rows in range(1, 17):
            rewind(cache, 32)
            block = target(input_ids=ids[None, 32 : 32 + rows], past_key_values=cache).logits[0]
            assert torch.equal(block, singles[:rows]), f"{kernels}: a {rows}-row pass"
            assert cache.get_seq_length() == 32 + rows


@pytest.mark.parametrize("kernels", ["onednn", "int4"])
def test_a_packed_pass_gives_each_sequence_what_it_gets_alone(kernels):
    from serving.engine.batch.ragged import packed_pass, use_ragged_attention

    target = tiny_target(kernels)
    use_ragged_attention(target.model)
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 96, (n,), generator=generator) for n in (9, 20, 5)]
    blocks = [torch.randint(3, 96, (k,), generator=generator) for k in (1, 4, 3)]
    with torch.inference_mode():
        alone = []
        for prompt, block in zip(prompts, blocks, strict=True):
            cache = target.new_cache()
            target(input_ids=prompt[None], past_key_values=cache)
            alone.append(target(input_ids=block[None], past_key_values=cache).logits[0])
        caches = []
        for prompt in prompts:
            caches.append(target.new_cache())
            target(input_ids=prompt[None], past_key_values=caches[-1])
        packed = packed_pass(target, caches, blocks)
    for want, got in zip(alone, packed.logits, strict=True):
        assert torch.equal(got, want)
    assert [c.get_seq_length() for c in caches] == [10, 24, 8]


@pytest.mark.parametrize("kernels", ["onednn", "int4"])
def test_a_packed_pass_takes_caches_of_different_capacities(kernels):
    """A long request's cache grew past the first capacity while the others did not: the
    pass still packs them, each sequence getting what it gets alone (it once refused the
    batch and every request fell back to a pass of its own)."""
    from serving.engine.batch.ragged import packed_pass, use_ragged_attention

    target = tiny_target(kernels, max_positions=2048)
    use_ragged_attention(target.model)
    generator = torch.Generator().manual_seed(6)
    prompts = [torch.randint(3, 96, (n,), generator=generator) for n in (600, 7)]
    blocks = [torch.randint(3, 96, (k,), generator=generator) for k in (3, 2)]
    with torch.inference_mode():
        alone = []
        for prompt, block in zip(prompts, blocks, strict=True):
            cache = target.new_cache()
            target(input_ids=prompt[None], past_key_values=cache)
            alone.append(target(input_ids=block[None], past_key_values=cache).logits[0])
        caches = []
        for prompt in prompts:
            caches.append(target.new_cache())
            target(input_ids=prompt[None], past_key_values=caches[-1])
        assert caches[0].capacity > caches[1].capacity
        packed = packed_pass(target, caches, blocks)
    for want, got in zip(alone, packed.logits, strict=True):
        assert torch.equal(got, want)


def test_hidden_states_and_logits_to_keep():
    target = tiny_target("int4")
    reference = tiny_target("int4", lean=False)
    ids = torch.randint(3, 96, (1, 12), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        full = target(input_ids=ids, past_key_values=target.new_cache(), output_hidden_states=True)
        last = target(input_ids=ids, past_key_values=target.new_cache(), logits_to_keep=1)
        want = reference(
            input_ids=ids, past_key_values=reference.new_cache(), output_hidden_states=True
        )
    assert full.logits.shape == (1, 12, 96) and last.logits.shape == (1, 1, 96)
    assert torch.equal(last.logits[0, 0], full.logits[0, -1])
    hidden = full.hidden_states[-1]
    assert hidden.shape == (1, 12, 64)
    assert torch.allclose(
        hidden, want.hidden_states[-1], atol=0.05 * want.hidden_states[-1].abs().max()
    )


def test_the_cache_grows_past_its_first_capacity_and_keeps_what_it_held():
    target = tiny_target("onednn", max_positions=2048)
    ids = torch.randint(3, 96, (700,), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        grown = target.new_cache()
        assert grown.capacity == 512
        a = target(input_ids=ids[None, :500], past_key_values=grown).logits[0, -1]
        b = target(input_ids=ids[None, 500:], past_key_values=grown).logits[0]
        assert grown.capacity >= 700 and grown.get_seq_length() == 700
        roomy = LeanCache(4, 2, 16, limit=2048, capacity=1024)
        c = target(input_ids=ids[None, :500], past_key_values=roomy).logits[0, -1]
        d = target(input_ids=ids[None, 500:], past_key_values=roomy).logits[0]
    assert torch.equal(a, c) and torch.equal(b, d)


def test_a_pass_past_the_position_limit_is_refused_and_leaves_the_cache():
    from serving.errors import SpecOpsError

    target = tiny_target("int8", max_positions=64)
    cache = target.new_cache()
    with torch.inference_mode():
        target(input_ids=torch.full((1, 60), 5), past_key_values=cache)
        with pytest.raises(SpecOpsError, match="64 positions"):
            target(input_ids=torch.full((1, 5), 5), past_key_values=cache)
    assert cache.get_seq_length() == 60


def test_other_caches_still_run_transformers_forward():
    from transformers import DynamicCache

    target = tiny_target("int4")
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        out = target(
            input_ids=ids, past_key_values=DynamicCache(config=target.config), use_cache=True
        )
        plain = target(input_ids=ids)
    assert (
        isinstance(out.past_key_values, DynamicCache) and out.past_key_values.get_seq_length() == 6
    )
    assert torch.equal(out.logits, plain.logits)
