"""One step everywhere: with transformers' decoder layers made to raise on the target, every
front still decodes — alone, in packed batches, as the distributed target, with ``layers:N``
and head drafts, and in ``specops chat`` — so none keeps the old path unseen."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel

from serving.curves import BatchLimits, PassCost
from serving.engine.batch.batch import decode_together
from serving.engine.batch.ragged import use_ragged_attention
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.factory import build_drafter
from serving.engine.drafters.head import HeadDrafter
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.policy import FixedK
from serving.models.head import DraftHead, head_config_for
from serving.target import LoadedTarget
from tests.serving.lean.models import tiny_target

PROMPTS = [[1, 5, 17, 42, 8, 5, 17, 42, 33, 9, 5, 17], [3, 4, 5, 6, 3, 4, 5, 6, 3, 4], [7]]


def _forbid_transformers_layers(model: PreTrainedModel) -> None:
    def raising(*args, **kwargs):
        raise AssertionError("transformers' decoder layer ran")

    for layer in model.model.layers:
        layer.forward = raising


@pytest.fixture(scope="module")
def lean_target():
    target = tiny_target("onednn", num_layers=3, max_positions=512)
    use_ragged_attention(target.model)
    _forbid_transformers_layers(target.model)
    return target


def _plain(target: LoadedTarget, prompt, new=24):
    return SpeculativeDecoder(target).generate(prompt, max_new_tokens=new).token_ids


def _drafters(target: LoadedTarget):
    torch.manual_seed(0)
    head = DraftHead(head_config_for(target.model, intermediate_size=48)).eval()
    return [
        (PromptLookupDrafter(), FixedK(4)),
        (build_drafter("layers:1", target), FixedK(3)),
        (HeadDrafter(head, target), FixedK(2)),
    ]


def test_the_engine_and_every_draft_kind_decode_on_the_lean_step(lean_target):
    with pytest.raises(AssertionError, match="decoder layer ran"), torch.inference_mode():
        lean_target(input_ids=torch.tensor([[1, 2]]))  # no lean cache: transformers' path
    for prompt in PROMPTS:
        expected = _plain(lean_target, prompt)
        for drafter, policy in _drafters(lean_target):
            decoder = SpeculativeDecoder(lean_target, drafter=drafter, policy=policy)
            result = decoder.generate(prompt, max_new_tokens=24)
            assert result.token_ids == expected, drafter.name


def test_packed_batches_decode_on_the_lean_step(lean_target):
    expected = [_plain(lean_target, prompt) for prompt in PROMPTS for _ in range(3)]
    decodings = [
        SpeculativeDecoder(lean_target, drafter=drafter, policy=policy).begin(
            prompt, max_new_tokens=24
        )
        for prompt in PROMPTS
        for drafter, policy in _drafters(lean_target)
    ]
    limits = BatchLimits(max_sequences=4, max_tokens_per_pass=16)
    results = decode_together(decodings, lean_target, limits=limits, cost=PassCost())
    assert [r.token_ids for r in results] == expected


def test_the_distributed_target_serves_the_lean_step(lean_target):
    from serving.distributed.client import TargetClient, run_distributed
    from serving.distributed.server import TargetLimits, TargetService, serve_target

    running = serve_target(TargetService(lean_target, eos_token_ids=[], limits=TargetLimits()))
    try:
        with TargetClient(f"127.0.0.1:{running.port}", timeout_s=30) as client:
            for prompt in PROMPTS:
                result = run_distributed(
                    client,
                    prompt,
                    drafter=PromptLookupDrafter(),
                    policy=FixedK(4),
                    max_new_tokens=24,
                )
                assert result.token_ids == _plain(lean_target, prompt)
    finally:
        running.stop()


def test_chat_answers_on_the_lean_step(model_folder):
    from serving.hardware import engine_target
    from serving.loader import load_target
    from specops.chat.commands import Settings
    from specops.chat.session import ChatSession

    target = load_target(str(model_folder), engine_target("cpu"), lean_mode="on")
    _forbid_transformers_layers(target.model)
    session = ChatSession(target, settings=Settings(max_tokens=12, policy="fixed", k=3))
    session.set("drafter", "layers:1")
    turn = session.ask("Say hello")
    assert turn.result.token_ids and turn.result.stats.draft_tokens > 0
    rows = session.compare(["pld"])
    assert all(row.matches_plain for row in rows)
