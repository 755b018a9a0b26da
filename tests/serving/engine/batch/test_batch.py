"""Batched decoding on tiny models: a request's output inside a batch equals its output
alone — for mixed prompt lengths, drafters, policies and acceptance patterns, with requests
joining and leaving mid-batch — and failures stay with the request that caused them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import serving.engine.batch.batch as batch_module
from serving.curves import BatchLimits, PassCost
from serving.engine.batch.batch import Batch, decode_together
from serving.engine.batch.ragged import packed_pass, use_ragged_attention
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.base import DraftProposal
from serving.engine.drafters.head import HeadDrafter
from serving.engine.drafters.model import ModelDrafter
from serving.engine.drafters.ngram_store import NGramDrafter
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.policy import AdaptiveK, CostAwareK, FixedK
from serving.engine.sampling import SamplingParams, make_sampler
from serving.errors import BadInputError
from serving.hardware import engine_target
from serving.lean.install import make_step
from serving.models.head import DraftHead, head_config_for
from serving.models.kernels import apply_kernels
from serving.models.tiny import tiny_llama
from serving.models.truncated import first_layers
from serving.target import LoadedTarget
from tests.serving.engine.test_verify import P_MIN, chisquare_pvalue

# Prompts of mixed lengths; the repeated n-grams give prompt lookup something to draft.
PROMPTS = [
    [1, 5, 17, 42, 8, 5, 17, 42, 33, 9, 5, 17],
    [7],
    [3, 4, 5, 6, 3, 4, 5, 6, 3, 4],
    [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 11, 12, 13],
    [9, 9, 9, 9],
    [40, 41, 40, 41, 40],
    [60, 61, 62, 63, 64, 65, 66],
]
BUDGETS = [40, 12, 33, 25, 8, 30, 21]


@pytest.fixture(scope="module", params=["stock", "onednn", "lean"])
def batch_target(request):
    """A target of its own (batching switches its attention): stock and oneDNN kernels
    through transformers' forward, and oneDNN through the lean step (serving.lean)."""
    model = tiny_llama()
    if request.param == "lean":
        apply_kernels(model, "onednn", fuse=True)
        step = make_step(model, "on")
    else:
        apply_kernels(model, request.param)
        step = None
    use_ragged_attention(model)
    if request.param == "stock":
        return LoadedTarget.of(model)
    return LoadedTarget.of(model, hardware=engine_target("cpu"), step=step)


def _drafters(target: LoadedTarget):
    torch.manual_seed(0)
    head = DraftHead(head_config_for(target.model, intermediate_size=48)).eval()
    return [
        lambda: (PromptLookupDrafter(), FixedK(4)),
        lambda: (None, None),
        lambda: (ModelDrafter(target.over(first_layers(target.model, 2))), AdaptiveK(2, k_max=6)),
        lambda: (NGramDrafter(), CostAwareK(k_max=6)),
        lambda: (ModelDrafter(LoadedTarget.of(tiny_llama(seed=1))), FixedK(3)),
        lambda: (HeadDrafter(head, target), FixedK(2)),
        # itself: all accepted
        lambda: (ModelDrafter(LoadedTarget.of(tiny_llama())), CostAwareK(k_max=8)),
    ]


def _decoder(target: LoadedTarget, make, eos=()):
    drafter, policy = make()
    return SpeculativeDecoder(target, drafter=drafter, policy=policy, eos_token_ids=eos)


def _solo(target: LoadedTarget, makes, eos=()):
    return [
        _decoder(target, make, eos).generate(prompt, max_new_tokens=budget).token_ids
        for make, prompt, budget in zip(makes, PROMPTS, BUDGETS, strict=True)
    ]


def test_a_packed_pass_computes_each_row_as_a_one_token_pass(batch_target):
    prompts = [torch.tensor(p) for p in PROMPTS[:4]]
    blocks = [torch.tensor(b) for b in ([4], [8, 9, 10, 11], [5, 6], [1, 2, 3])]
    exact = batch_target.kernels == "onednn"
    with torch.inference_mode():
        caches = []
        for prompt in prompts:
            caches.append(batch_target.new_cache())
            batch_target(input_ids=prompt[None], past_key_values=caches[-1], use_cache=True)
        packed = packed_pass(batch_target, caches, blocks)
        for prompt, block, logits, cache in zip(
            prompts, blocks, packed.logits, caches, strict=True
        ):
            alone = batch_target.new_cache()
            batch_target(input_ids=prompt[None], past_key_values=alone, use_cache=True)
            rows = [
                batch_target(input_ids=t.view(1, 1), past_key_values=alone, use_cache=True).logits[
                    0
                ]
                for t in block
            ]
            reference = torch.cat(rows)  # [rows, vocab]
            assert cache.get_seq_length() == len(prompt) + len(block)
            if exact:
                assert torch.equal(logits, reference)
            else:
                torch.testing.assert_close(logits, reference, rtol=0, atol=1e-4)
                assert torch.equal(logits.argmax(-1), reference.argmax(-1))


@pytest.mark.parametrize("max_sequences", [1, 3, 8])
def test_batched_greedy_equals_each_request_alone(batch_target, max_sequences):
    makes = _drafters(batch_target)
    solo = _solo(batch_target, makes)
    decodings = [
        _decoder(batch_target, make).begin(prompt, max_new_tokens=budget)
        for make, prompt, budget in zip(makes, PROMPTS, BUDGETS, strict=True)
    ]
    # Three at a time: the later requests join as earlier ones finish, mid-batch.
    limits = BatchLimits(max_sequences=max_sequences, max_tokens_per_pass=max(8, 4 * max_sequences))
    results = decode_together(decodings, batch_target, limits=limits, cost=PassCost())
    assert [r.token_ids for r in results] == solo
    assert sum(r.stats.draft_tokens for r in results) > 0
    assert all(r.stop_reason == "length" for r in results)


def test_eos_inside_a_batch_ends_only_that_request(batch_target):
    makes = _drafters(batch_target)
    eos = (2,)
    solo = _solo(batch_target, makes, eos)
    assert any(len(tokens) < budget for tokens, budget in zip(solo, BUDGETS, strict=True))
    decodings = [
        _decoder(batch_target, make, eos).begin(prompt, max_new_tokens=budget)
        for make, prompt, budget in zip(makes, PROMPTS, BUDGETS, strict=True)
    ]
    results = decode_together(decodings, batch_target, limits=BatchLimits(4, 24))
    assert [r.token_ids for r in results] == solo


def test_requests_join_and_leave_between_steps(batch_target):
    makes = _drafters(batch_target)
    solo = _solo(batch_target, makes)
    decodings = [
        _decoder(batch_target, make).begin(prompt, max_new_tokens=budget)
        for make, prompt, budget in zip(makes, PROMPTS, BUDGETS, strict=True)
    ]
    batch = Batch(batch_target, BatchLimits(8, 64))
    outputs: dict[int, list[int]] = {i: [] for i in range(len(decodings))}
    batch.join(decodings[0])
    batch.join(decodings[1])
    cancelled = decodings[2]
    for step in range(60):
        if step == 2:
            batch.join(cancelled)
        if step == 3:
            batch.join(decodings[3])
        if step == 5:  # a cancelled request leaves mid-decoding
            batch.leave(cancelled)
            assert cancelled.finish("cancelled").stop_reason == "cancelled"
        if step in (6, 7, 8):
            batch.join(decodings[step - 2])
        outcome = batch.step()
        assert not outcome.errors
        for decoding, events in outcome.events.items():
            outputs[decodings.index(decoding)].extend(e.token_id for e in events)
        for decoding in [d for d in batch.members if d.done]:
            batch.leave(decoding)
    assert not batch.members
    for i, tokens in outputs.items():
        if decodings[i] is cancelled:
            assert tokens == solo[i][: len(tokens)] and 0 < len(tokens) < BUDGETS[i]
        else:
            assert tokens == solo[i], f"request {i}"


class _Failing(PromptLookupDrafter):
    """Prompt lookup that raises on its third proposal."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def propose(self, request) -> DraftProposal:
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("drafter broke")
        return super().propose(request)


def test_a_failing_drafter_fails_its_request_alone(batch_target):
    makes = _drafters(batch_target)[:4]
    solo = _solo(batch_target, makes + [lambda: (None, None)] * 3)[:4]
    decodings = [
        _decoder(batch_target, make).begin(prompt, max_new_tokens=budget)
        for make, prompt, budget in zip(makes, PROMPTS, BUDGETS, strict=False)
    ]
    broken = SpeculativeDecoder(batch_target, drafter=_Failing(), policy=FixedK(3)).begin(
        PROMPTS[0], max_new_tokens=30
    )
    batch = Batch(batch_target, BatchLimits(8, 64))
    for decoding in [*decodings, broken]:
        batch.join(decoding)
    outputs = {d: [] for d in decodings}
    failed = []
    while batch.members:
        outcome = batch.step()
        for decoding, error in outcome.errors.items():
            failed.append((decoding, error))
            batch.leave(decoding)
        for decoding, events in outcome.events.items():
            if decoding in outputs:
                outputs[decoding].extend(e.token_id for e in events)
        for decoding in [d for d in batch.members if d.done]:
            batch.leave(decoding)
    assert [(d, str(e)) for d, e in failed] == [(broken, "drafter broke")]
    assert [outputs[d] for d in decodings] == solo


def test_a_failing_packed_pass_steps_each_request_alone(batch_target, monkeypatch):
    makes = _drafters(batch_target)
    solo = _solo(batch_target, makes)
    real = batch_module.packed_pass
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] in (2, 5):
            raise RuntimeError("pass broke")
        return real(*args, **kwargs)

    monkeypatch.setattr(batch_module, "packed_pass", flaky)
    decodings = [
        _decoder(batch_target, make).begin(prompt, max_new_tokens=budget)
        for make, prompt, budget in zip(makes, PROMPTS, BUDGETS, strict=True)
    ]
    results = decode_together(decodings, batch_target, limits=BatchLimits(8, 64))
    assert calls["n"] > 5
    assert [r.token_ids for r in results] == solo


def test_requests_sharing_a_decoder_are_refused(batch_target):
    decoder = SpeculativeDecoder(batch_target, drafter=PromptLookupDrafter(), policy=FixedK(2))
    batch = Batch(batch_target)
    batch.join(decoder.begin(PROMPTS[0], max_new_tokens=4))
    with pytest.raises(BadInputError, match="share a decoder"):
        batch.join(decoder.begin(PROMPTS[1], max_new_tokens=4))
    with pytest.raises(BadInputError, match="max_tokens_per_pass"):
        BatchLimits(max_sequences=8, max_tokens_per_pass=4)


@pytest.mark.parametrize("drafter", ["model", "prompt_lookup"])
def test_sampling_through_a_batch_keeps_the_target_distribution(batch_target, drafter):
    """The first two sampled tokens of many requests decoded eight at a time follow the
    target's processed distributions: p(t1) and the marginal sum_t1 p(t1) p(t2 | t1)."""
    params = SamplingParams(temperature=1.0, top_k=6, seed=0)
    sampler = make_sampler(params)
    prompt = PROMPTS[0]
    vocab = batch_target.config.vocab_size
    with torch.inference_mode():
        first = sampler.probs(batch_target(torch.tensor([prompt])).logits[0, -1:])[0]  # [vocab]
        support = first.nonzero().flatten().tolist()
        follow = torch.stack(
            [
                sampler.probs(batch_target(torch.tensor([[*prompt, t]])).logits[0, -1:])[0]
                for t in support
            ]
        )  # [support, vocab]
        second = (first[support, None] * follow).sum(0)  # [vocab]
    draft_model = tiny_llama(seed=1)
    decodings = []
    for seed in range(600):
        made = (
            (ModelDrafter(LoadedTarget.of(draft_model)), FixedK(2))
            if drafter == "model"
            else (PromptLookupDrafter(), FixedK(2))
        )
        decoder = SpeculativeDecoder(batch_target, drafter=made[0], policy=made[1])
        decodings.append(
            decoder.begin(
                prompt, max_new_tokens=2, sampling=SamplingParams(1.0, top_k=6, seed=seed)
            )
        )
    results = decode_together(decodings, batch_target, limits=BatchLimits(8, 32))
    tokens = np.array([r.token_ids for r in results])  # [requests, 2]
    assert sum(r.stats.draft_tokens for r in results) > 0
    assert chisquare_pvalue(np.bincount(tokens[:, 0], minlength=vocab), first) > P_MIN
    assert chisquare_pvalue(np.bincount(tokens[:, 1], minlength=vocab), second) > P_MIN
