"""Teacher-forced records from the lean step: the features the served decode hands the head,
bit for bit, whatever shares the pass; and teacher caches built on a lean target."""

from __future__ import annotations

import torch

from serving.engine.decoder import SpeculativeDecoder
from tasks.train.lean_features import lean_teacher_forced
from tasks.train.teacher import TeacherConfig, load_teacher_data
from tasks.train.teacher_build import TeacherPrompt, build_teacher_cache
from tests.serving.lean.models import tiny_target


def _sequences(target, n: int = 4) -> tuple[list[list[int]], list[list[int]]]:
    generator = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, 96, (4 + 3 * i,), generator=generator).tolist() for i in range(n)]
    answers = [
        list(SpeculativeDecoder(target).generate(p, max_new_tokens=10).token_ids) for p in prompts
    ]
    return prompts, answers


def _served_hidden(target, sequence: list[int], prompt_len: int) -> torch.Tensor:
    """The hidden states as decoding computes them: the prompt's pass, then a token a pass."""
    step, cache = target.step, target.step.new_cache()
    with torch.inference_mode():
        parts = [step.forward(torch.tensor(sequence[:prompt_len]), [cache], [prompt_len],
                              keep=1, want_hidden=True).hidden]  # fmt: skip
        for token in sequence[prompt_len:]:
            parts.append(step.forward(torch.tensor([token]), [cache], [1], want_hidden=True).hidden)
    return torch.cat(parts)


def test_packed_records_are_the_served_features_and_the_greedy_choices():
    target = tiny_target("int4", num_layers=2)
    prompts, answers = _sequences(target)
    sequences = [p + a for p, a in zip(prompts, answers, strict=True)]
    records = lean_teacher_forced(target, sequences, top_k=3)
    for prompt, answer, sequence, (features, top_ids, logprobs) in zip(
        prompts, answers, sequences, records, strict=True
    ):
        assert torch.equal(features, _served_hidden(target, sequence, len(prompt)))
        assert top_ids.shape == logprobs.shape == (len(sequence), 3)
        # The greedy answer is the target's first choice at every position that produced it.
        assert top_ids[len(prompt) - 1 : -1, 0].tolist() == answer
        assert (logprobs[:, 0] >= logprobs[:, 1]).all() and (logprobs <= 0).all()


def test_a_teacher_cache_built_on_a_lean_target_records_it(tmp_path):
    target = tiny_target("int8", num_layers=2)
    prompts, answers = _sequences(target, 3)
    teacher_prompts = [TeacherPrompt(f"p{i}", p) for i, p in enumerate(prompts)]
    report = build_teacher_cache(
        target,
        teacher_prompts,
        tmp_path / "teacher",
        eos_token_ids=[],
        config=TeacherConfig(max_new_tokens=10, feature_dtype="float32", shard_size=2),
        progress=False,
    )
    assert report.generated_tokens == sum(map(len, answers))
    manifest, data = load_teacher_data(tmp_path / "teacher")
    assert manifest.target["hardware"] == "cpu-int8" and manifest.target["step"] == "lean"
    sequences = [p + a for p, a in zip(prompts, answers, strict=True)]
    records = lean_teacher_forced(target, sequences, top_k=manifest.config.top_k)
    for sequence, stored, (features, _, _) in zip(sequences, data, records, strict=True):
        assert stored.tokens.tolist() == sequence  # the lean target's own answers
        assert torch.equal(stored.features, features)
