"""The lean head step against ``DraftHead``'s own forward (transformers' decoder block over
the same weights on the same kernels), and the mutations that comparison must catch."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from serving.lean.build import load_ops
from serving.lean.head_step import LeanHeadStep
from serving.lean.tiles import adopt_tiles
from serving.models.head import DraftHead, causal_mask, head_config_for, output_weight
from serving.models.kernels import apply_kernels
from serving.target import LoadedTarget, dynamic_cache
from tests.serving.lean.models import KERNELS, tiny_target

SPLITS = [24, 1, 3, 1, 4, 7]  # a prompt's pairs, then pairs committed a few at a time
# Logit bound, relative to the largest logit: oneDNN's float32 differs by summation order
# only; the integer kernels round activations to int8, and an ulp upstream can move one.
BOUND = {"onednn": 1e-4, "int8": 1e-3, "int4": 1e-3}
TOP1 = 0.99


def _head(
    target: LoadedTarget, layout: str = "specops", reduced: int | None = 48, ffn: int = 96
) -> DraftHead:
    torch.manual_seed(3)
    vocab_ids = None
    if reduced is not None:
        vocab_ids = torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(4))
        vocab_ids = vocab_ids[:reduced]
    config = head_config_for(
        target.model, intermediate_size=ffn, draft_vocab_size=reduced, layout=layout
    )
    head = DraftHead(config, vocab_ids=vocab_ids).eval()
    # Weights far from init's (0.02, norms of ones), so logits spread and top-1 means
    # something, and every norm's weight matters.
    with torch.no_grad():
        for name, parameter in head.named_parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.15)
            elif "norm" in name:
                parameter.uniform_(0.5, 1.5)
            else:
                parameter.normal_(0.0, 0.1)
    return head


def _reference(head: DraftHead, target: LoadedTarget, features, tokens) -> torch.Tensor:
    """``DraftHead``'s forward on the target's kernels, fed in :data:`SPLITS`, then the
    target's output rows of the head's vocabulary: ``[n, draft_vocab]``."""
    packed = copy.deepcopy(head)
    apply_kernels(packed, target.kernels, exact=False, fuse=True)
    rows = output_weight(target.model).detach().float()
    if head.vocab_ids is not None:
        rows = rows[head.vocab_ids]
    output = nn.ModuleList([nn.Linear(rows.shape[1], rows.shape[0], bias=False)])
    output[0].weight = nn.Parameter(rows.clone(), requires_grad=False)
    apply_kernels(output, target.kernels, exact=False)
    if target.kernels != "onednn":
        load_ops()
        adopt_tiles(packed)
        adopt_tiles(output)
    embed = target.model.get_input_embeddings()
    cache = dynamic_cache(packed.config)
    parts, start = [], 0
    for size in SPLITS:
        positions = torch.arange(start, start + size)[None]
        mask = causal_mask(size, start)
        f = features[None, start : start + size]
        out = packed(f, embed(tokens[start : start + size])[None], positions, mask, cache)
        parts.append(output[0](out[0]).float())
        start += size
    return torch.cat(parts)


def _lean(step: LeanHeadStep, features, tokens) -> torch.Tensor:
    cache = step.new_cache()
    parts, start = [], 0
    for size in SPLITS:
        predicted = step.feed(features[start : start + size], tokens[start : start + size], cache)
        parts.append(step.logits(predicted))
        start += size
    assert cache.length == start
    return torch.cat(parts)


def _inputs(target: LoadedTarget):
    n = sum(SPLITS)
    generator = torch.Generator().manual_seed(5)
    features = torch.randn(n, target.config.hidden_size, generator=generator)
    tokens = torch.randint(0, target.vocab_size, (n,), generator=generator)
    return features, tokens


def _agreement(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    top1 = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    return top1, ((got - want).abs().max() / want.abs().max()).item()


@pytest.fixture(scope="module", params=KERNELS)
def target(request):
    return tiny_target(request.param)


@pytest.mark.parametrize("layout", ["specops", "eagle"])
@pytest.mark.parametrize("reduced", [48, None])
def test_the_lean_head_step_computes_the_heads_forward(target, layout, reduced):
    head = _head(target, layout, reduced)
    features, tokens = _inputs(target)
    with torch.inference_mode():
        want = _reference(head, target, features, tokens)
        got = _lean(LeanHeadStep(head, target.model), features, tokens)
    assert got.shape == want.shape == (sum(SPLITS), reduced or target.vocab_size)
    top1, bound = _agreement(got, want)
    assert top1 >= TOP1 and bound < BOUND[target.kernels], (top1, bound)


def test_a_layer_the_integer_kernels_cannot_shape_runs_in_float(target):
    head = _head(target, ffn=48)  # the down projection's 48 inputs: not whole groups of 32
    features, tokens = _inputs(target)
    with torch.inference_mode():
        want = _reference(head, target, features, tokens)
        got = _lean(LeanHeadStep(head, target.model), features, tokens)
    top1, bound = _agreement(got, want)
    assert top1 >= TOP1 and bound < BOUND[target.kernels], (top1, bound)


def _wrong_rotary(step: LeanHeadStep) -> None:
    step.cos, step.sin = step.cos.roll(3, 0), step.sin.roll(3, 0)


def _wrong_norm(step: LeanHeadStep) -> None:
    step.final_norm = torch.flip(step.final_norm, [0]).contiguous()


def _no_norm(step: LeanHeadStep) -> None:
    step.final_norm = None


def _step_with_wrong_vocabulary(head: DraftHead, target: LoadedTarget) -> LeanHeadStep:
    wrong = copy.deepcopy(head)
    assert wrong.vocab_ids is not None
    wrong.vocab_ids = wrong.vocab_ids.roll(1)  # each logit row read from its neighbour's id
    return LeanHeadStep(wrong, target.model)


@pytest.mark.parametrize("mutation", ["rotary", "norm", "no-norm", "vocabulary"])
def test_the_comparison_fails_when_the_step_is_wrong(target, mutation):
    head = _head(target)
    features, tokens = _inputs(target)
    if mutation == "vocabulary":
        step = _step_with_wrong_vocabulary(head, target)
    else:
        step = LeanHeadStep(head, target.model)
        {"rotary": _wrong_rotary, "norm": _wrong_norm, "no-norm": _no_norm}[mutation](step)
    with torch.inference_mode():
        want = _reference(head, target, features, tokens)
        got = _lean(step, features, tokens)
    top1, bound = _agreement(got, want)
    assert top1 < TOP1 or bound >= BOUND[target.kernels], (mutation, top1, bound)


def _python_drafts(step: LeanHeadStep, feature: torch.Tensor, k: int, cache) -> list[int]:
    drafts = []
    for i in range(k):
        token = step.to_full(step.logits(feature[None])[0].argmax())
        drafts.append(int(token))
        if i < k - 1:
            feature = step.feed(feature[None], token.view(1), cache)[0]
    return drafts


@pytest.mark.parametrize("reduced", [48, None])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_one_native_call_drafts_what_the_step_drafts_one_at_a_time(target, reduced, k):
    head = _head(target, reduced=reduced)
    step = LeanHeadStep(head, target.model)
    features, tokens = _inputs(target)
    with torch.inference_mode():
        caches = [step.new_cache(), step.new_cache()]
        tails = [step.feed(features[:20], tokens[:20], cache)[-1] for cache in caches]
        native = step.draft_greedy(tails[0], k, caches[0])
        if target.kernels == "onednn":  # float32 weights: drafted from Python
            assert native is None
            return
        assert native is not None
        assert native.tolist() == _python_drafts(step, tails[1], k, caches[1])
    assert caches[0].length == caches[1].length == 20 + k - 1
    rows = slice(0, caches[0].length)
    assert torch.equal(caches[0].values[:, :, rows], caches[1].values[:, :, rows])


def test_an_eagle_layout_head_drafts_from_python(target):
    step = LeanHeadStep(_head(target, layout="eagle"), target.model)
    feature, _ = _inputs(target)
    with torch.inference_mode():
        assert step.draft_greedy(feature[0], 3, step.new_cache()) is None
