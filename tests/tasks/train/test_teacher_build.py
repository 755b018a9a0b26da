"""Building teacher data on the tiny random target: what is recorded (read back through
tasks/train/teacher.py), resuming, and refusals.

Prompts here are random token ids (tests only; real teacher data comes from ShareGPT)."""

from __future__ import annotations

import pytest
import torch

import tasks.train.teacher_build as teacher_build
from serving.errors import BadInputError
from tasks.train.teacher import MANIFEST, TeacherConfig, load_teacher_data
from tasks.train.teacher_build import TeacherPrompt, build_teacher_cache, encode_traffic

EOS = 2
CONFIG = TeacherConfig(
    max_new_tokens=16,
    top_k=4,
    shard_size=2,
    generation_batch_size=2,
    batch_tokens=40,
    feature_dtype="float32",
)


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


def tiny_prompts(n: int, seed: int = 0) -> list[TeacherPrompt]:
    generator = torch.Generator().manual_seed(seed)
    return [
        TeacherPrompt(
            f"p{i}",
            torch.randint(
                3, 96, (int(torch.randint(3, 14, (1,), generator=generator)),), generator=generator
            ).tolist(),
        )
        for i in range(n)
    ]


def build(target, prompts, path, config=CONFIG):
    return build_teacher_cache(
        target, prompts, path, eos_token_ids=[EOS], config=config, progress=False
    )


def plain_greedy(target, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.inference_mode():
        input_ids = torch.tensor([prompt])
        out = target.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=EOS,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    return out[: out.index(EOS) + 1] if EOS in out else out


def test_records_the_targets_greedy_answers_features_and_top_k(target, tmp_path):
    prompts = tiny_prompts(5)
    report = build(target, prompts, tmp_path)
    assert (report.sequences, report.shards_written, report.shards_skipped) == (5, 3, 0)
    assert report.generate_tokens_per_s and report.forward_tokens_per_s
    manifest, sequences = load_teacher_data(tmp_path)
    assert [s.prompt_id for s in sequences] == [p.id for p in prompts]
    assert report.tokens == manifest.tokens == sum(s.tokens.shape[0] for s in sequences)
    for prompt, sequence in zip(prompts, sequences, strict=True):
        assert sequence.prompt_len == len(prompt.token_ids)
        assert sequence.tokens[: sequence.prompt_len].tolist() == prompt.token_ids
        answer = sequence.tokens[sequence.prompt_len :].tolist()
        assert answer == plain_greedy(target, prompt.token_ids, CONFIG.max_new_tokens)
        with torch.inference_mode():
            out = target(sequence.tokens[None], output_hidden_states=True)
        torch.testing.assert_close(sequence.features, out.hidden_states[-1][0])
        top = out.logits[0].log_softmax(-1).topk(CONFIG.top_k)
        assert torch.equal(sequence.top_ids, top.indices)
        torch.testing.assert_close(sequence.top_logprobs, top.values)
        # The answer is the target's own greedy continuation, position by position.
        predicted = sequence.top_ids[sequence.prompt_len - 1 : -1, 0]
        assert predicted.tolist() == answer


def test_an_interrupted_run_resumes_and_skips_written_shards(target, tmp_path, monkeypatch):
    prompts = tiny_prompts(6)
    real = teacher_build.greedy_answers
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed while generating the second shard
        return real(*args, **kwargs)

    monkeypatch.setattr(teacher_build, "greedy_answers", failing)
    with pytest.raises(KeyboardInterrupt):
        build(target, prompts, tmp_path / "cache")
    monkeypatch.setattr(teacher_build, "greedy_answers", real)
    written = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert written == [MANIFEST, "shard-00000.safetensors"]  # no temporary file left behind

    resumed = build(target, prompts, tmp_path / "cache")
    assert (resumed.shards_skipped, resumed.shards_written) == (1, 2)
    clean = build(target, prompts, tmp_path / "clean")
    _, got = load_teacher_data(tmp_path / "cache")
    _, expected = load_teacher_data(tmp_path / "clean")
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a.tokens, b.tokens)
        torch.testing.assert_close(a.features, b.features)
    assert resumed.tokens == clean.tokens

    again = build(target, prompts, tmp_path / "cache")
    assert (again.shards_skipped, again.shards_written) == (3, 0)
    assert again.generate_tokens_per_s is None


def test_a_corrupt_shard_is_rebuilt_and_reported_when_read(target, tmp_path):
    prompts = tiny_prompts(4)
    build(target, prompts, tmp_path)
    (tmp_path / "shard-00001.safetensors").write_bytes(b"garbage")
    with pytest.raises(BadInputError, match=r"shard-00001\.safetensors is missing or corrupt"):
        load_teacher_data(tmp_path)
    report = build(target, prompts, tmp_path)
    assert (report.shards_skipped, report.shards_written) == (1, 1)
    assert len(load_teacher_data(tmp_path)[1]) == 4


def test_other_settings_in_the_same_folder_are_refused(target, tmp_path):
    build(target, tiny_prompts(2), tmp_path)
    other = CONFIG.model_copy(update={"max_new_tokens": 8})
    with pytest.raises(BadInputError, match="another target or other settings"):
        build(target, tiny_prompts(2), tmp_path, config=other)


def test_bad_prompts_are_reported(target, tmp_path):
    with pytest.raises(BadInputError, match="no prompts"):
        build(target, [], tmp_path)
    with pytest.raises(BadInputError, match="have no tokens"):
        build(target, [TeacherPrompt("empty", [])], tmp_path)
    with pytest.raises(BadInputError, match="ids repeat"):
        build(target, [TeacherPrompt("a", [5]), TeacherPrompt("a", [6])], tmp_path)


def test_encode_traffic_applies_the_tokenizer_and_drops_long_prompts(char_tokenizer, make_prompts):
    prompts = make_prompts(["short", "a much longer prompt text"])
    encoded = encode_traffic(char_tokenizer, prompts, max_prompt_tokens=10)
    assert [p.id for p in encoded] == ["p0"]
    assert encoded[0].token_ids == char_tokenizer("short")["input_ids"]


def test_given_answers_replace_generation_and_match_it(target, tmp_path):
    prompts = tiny_prompts(5)
    build(target, prompts, tmp_path / "generated")
    _, generated = load_teacher_data(tmp_path / "generated")
    answers = {s.prompt_id: s.tokens[s.prompt_len :].tolist() for s in generated}
    report = build_teacher_cache(
        target, prompts, tmp_path / "given", eos_token_ids=[EOS], config=CONFIG,
        answers=answers, progress=False,
    )  # fmt: skip
    assert report.generated_tokens == 0 and report.generate_tokens_per_s is None
    _, given = load_teacher_data(tmp_path / "given")
    for a, b in zip(given, generated, strict=True):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.top_ids, b.top_ids)
        torch.testing.assert_close(a.features, b.features)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda answers: answers.pop("p1"), "have no given answer"),
        (lambda answers: answers.update(p1=[5] * (CONFIG.max_new_tokens + 1)), "more than"),
        (lambda answers: answers.update(p1=[5, 10_000]), "outside the target's vocabulary"),
    ],
)
def test_bad_given_answers_are_refused_by_name(target, tmp_path, change, message):
    prompts = tiny_prompts(3)
    answers = {p.id: [5, 6] for p in prompts}
    change(answers)
    with pytest.raises(BadInputError, match=message):
        build_teacher_cache(
            target, prompts, tmp_path, eos_token_ids=[EOS], config=CONFIG, answers=answers,
            progress=False,
        )  # fmt: skip
    assert not (tmp_path / MANIFEST).exists()  # refused before any work
