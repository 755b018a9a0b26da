"""The feature-level draft head and its drafter on the tiny random target.

Heads trained for a few hundred steps on the tiny target's own greedy answers (so that
drafts are accepted and every rewind path runs), plus an untrained one."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.base import DraftRequest, StepFeedback
from serving.engine.drafters.factory import build_drafter, parse_drafter_spec
from serving.engine.drafters.head import HeadDrafter, TransformersHead
from serving.engine.kv import cache_length
from serving.engine.policy import FixedK
from serving.engine.sampling import SamplingParams, make_sampler
from serving.engine.step import speculative_step
from serving.errors import BadInputError, IncompatibleDraftError, ModelSourceError, SpecOpsError
from serving.lean.head_step import LeanHeadStep
from serving.models.head import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    DraftHead,
    causal_mask,
    head_config_for,
    load_head,
    output_weight,
    save_head,
)
from serving.models.onednn import onednn_available, pack_linear_layers
from serving.models.tiny import tiny_llama
from serving.target import LoadedTarget
from tasks.train.teacher import TeacherConfig
from tasks.train.teacher_build import TeacherPrompt, build_teacher_cache
from tasks.train.train_head import TrainHeadConfig, train_head
from tests.serving.engine.test_verify import P_MIN, chisquare_pvalue
from tests.serving.lean.models import KERNELS, tiny_target

GREEDY = make_sampler()
NEW_TOKENS = 48  # conftest's greedy_reference length
VOCAB = 96


def _train(target, prompt, reference, tmp_path, draft_vocab_size):
    """A head that has seen the tiny target's answers, the reference's included."""
    generator = torch.Generator().manual_seed(0)
    prompts = [TeacherPrompt(f"ref{i}", prompt + reference[:i]) for i in (0, 8, 16, 24, 32)]
    prompts += [
        TeacherPrompt(f"rand{i}", torch.randint(3, VOCAB, (10,), generator=generator).tolist())
        for i in range(12)
    ]
    build_teacher_cache(
        target,
        prompts,
        tmp_path / "teacher",
        eos_token_ids=[2],
        config=TeacherConfig(max_new_tokens=24, feature_dtype="float32"),
        progress=False,
    )
    config = TrainHeadConfig(
        teacher_dir=tmp_path / "teacher",
        output_dir=tmp_path / "run",
        max_steps=200,
        learning_rate=1e-2,
        token_weight=1.0,
        intermediate_size=64,
        draft_vocab_size=draft_vocab_size,
        eval_fraction=0.0,
        eval_every=200,
        checkpoint_every=200,
    )
    return load_head(train_head(config, target, progress=False).head_dir, target)


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def trained_heads(target, prompt, greedy_reference, tmp_path_factory):
    with torch.random.fork_rng():
        return {
            "full": _train(target, prompt, greedy_reference, tmp_path_factory.mktemp("f"), None),
            "reduced": _train(target, prompt, greedy_reference, tmp_path_factory.mktemp("r"), 48),
        }


@pytest.fixture(scope="module")
def random_head(target):
    torch.manual_seed(0)
    return DraftHead(head_config_for(target, intermediate_size=48)).eval()


@pytest.fixture(params=["full", "reduced"])
def head(request, trained_heads):
    return trained_heads[request.param]


def reference_drafts(head: DraftHead, target, tokens: list[int], k: int) -> list[int]:
    """The head's greedy drafts continuing ``tokens``, recomputed from scratch (no cache)."""
    embed = target.get_input_embeddings()
    weight = output_weight(target)
    if head.vocab_ids is not None:
        weight = weight[head.vocab_ids]
    with torch.inference_mode():
        hidden = target(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
        features = hidden[-1][0]  # [n - 1, hidden] true f_0..f_{n-2}
        next_tokens = list(tokens[1:])  # x_1..x_{n-1}
        drafts: list[int] = []
        for _ in range(k):
            count = features.shape[0]
            out = head(
                features[None],
                embed(torch.tensor(next_tokens))[None],
                torch.arange(count)[None],
                causal_mask(count, 0),
            )[0]
            predicted = out[-1]  # [hidden]
            index = int((weight @ predicted).argmax())
            draft = index if head.vocab_ids is None else int(head.vocab_ids[index])
            drafts.append(draft)
            features = torch.cat([features, predicted[None]])
            next_tokens.append(draft)
    return drafts


def prompt_hidden(target, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        out = target(torch.tensor([tokens[:-1]]), output_hidden_states=True)
    return out.hidden_states[-1][0]  # [len(tokens) - 1, hidden]


# ---------------------------------------------------------------------- engine equality


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("vocab", ["full", "reduced"])
def test_greedy_speculative_equals_plain_greedy(
    loaded, prompt, greedy_reference, trained_heads, vocab, k
):
    drafter = HeadDrafter(trained_heads[vocab], loaded)
    result = SpeculativeDecoder(loaded, drafter=drafter, policy=FixedK(k)).generate(
        prompt, max_new_tokens=NEW_TOKENS
    )
    assert result.token_ids == greedy_reference
    assert result.stats.accepted_tokens > 0  # the trained head does get drafts accepted
    assert any(result.from_draft)


def test_untrained_head_keeps_greedy_output(loaded, prompt, greedy_reference, random_head):
    decoder = SpeculativeDecoder(loaded, drafter=HeadDrafter(random_head, loaded), policy=FixedK(3))
    assert decoder.generate(prompt, max_new_tokens=NEW_TOKENS).token_ids == greedy_reference


def test_one_token_prompt(loaded, trained_heads):
    prompt = [5]
    plain = SpeculativeDecoder(loaded).generate(prompt, max_new_tokens=20).token_ids
    drafter = HeadDrafter(trained_heads["full"], loaded)
    result = SpeculativeDecoder(loaded, drafter=drafter, policy=FixedK(4)).generate(
        prompt, max_new_tokens=20
    )
    assert result.token_ids == plain
    assert result.stats.draft_tokens > 0  # drafting starts once a hidden state exists


@pytest.mark.skipif(not onednn_available(), reason="torch built without oneDNN")
def test_packed_target_keeps_greedy_output(prompt, trained_heads):
    model = copy.deepcopy(tiny_llama())
    pack_linear_layers(model)
    packed = LoadedTarget.of(model)
    assert packed.kernels == "onednn"
    plain = SpeculativeDecoder(packed).generate(prompt, max_new_tokens=NEW_TOKENS).token_ids
    for head in trained_heads.values():
        drafter = HeadDrafter(head, packed)
        result = SpeculativeDecoder(packed, drafter=drafter, policy=FixedK(4)).generate(
            prompt, max_new_tokens=NEW_TOKENS
        )
        assert result.token_ids == plain
        assert result.stats.accepted_tokens > 0


# -------------------------------------------------------------------- cache bookkeeping


@pytest.mark.parametrize("accepted", [0, 1, 2, 3, 4])
def test_commit_keeps_only_true_pairs(target, loaded, prompt, head, accepted):
    drafter = HeadDrafter(head, loaded)
    drafter.begin(prompt)
    drafter.prefill(prompt_hidden(target, prompt))
    assert cache_length(drafter._cache) == len(prompt) - 1  # pairs (f_i, x_{i+1})
    drafts = drafter.propose(DraftRequest(prompt, 4, GREEDY)).tokens.tolist()
    assert drafts == reference_drafts(head, target, prompt, 4)
    # One speculative entry per draft but the last (sampled, never fed).
    assert cache_length(drafter._cache) == len(prompt) - 1 + 3

    correction = (drafts[accepted] + 1) % VOCAB if accepted < 4 else 7
    new_tokens = [*drafts[:accepted], correction]
    tokens = prompt + new_tokens
    # The target's features at the pending token and the accepted drafts.
    hidden = prompt_hidden(target, tokens)[len(prompt) - 1 :]
    assert hidden.shape[0] == accepted + 1
    drafter.commit(StepFeedback(4, accepted, new_tokens, tokens, target_hidden=hidden))
    # Speculative entries are all rewound; the new true pairs wait for the next proposal.
    assert cache_length(drafter._cache) == len(prompt) - 1

    next_drafts = drafter.propose(DraftRequest(tokens, 3, GREEDY)).tokens.tolist()
    assert next_drafts == reference_drafts(head, target, tokens, 3)
    assert cache_length(drafter._cache) == len(tokens) - 1 + 2


def test_cache_tracks_the_committed_tokens_across_steps(target, loaded, prompt, head):
    drafter = HeadDrafter(head, loaded)
    cache = loaded.new_cache()
    with torch.inference_mode():
        out = loaded(
            input_ids=torch.tensor([prompt[:-1]]),
            past_key_values=cache,
            use_cache=True,
            output_hidden_states=True,
        )
    drafter.begin(list(prompt))
    drafter.prefill(out.hidden_states[-1][0])
    tokens = list(prompt)
    accepted_counts = []
    # k = 0 steps (the policy skipping drafting) still commit, and their pairs are fed later.
    for k in itertools.islice(itertools.cycle([4, 0, 2, 3, 0, 0, 5, 1]), 24):
        expected = reference_drafts(head, target, tokens, k) if k else []
        step = speculative_step(loaded, cache, tokens, drafter, k, GREEDY)
        if k:
            assert step.proposed == k
            assert step.new_tokens[: step.accepted] == expected[: step.accepted]
            accepted_counts.append(step.accepted)
        tokens += step.new_tokens
        assert cache_length(cache) == len(tokens) - 1
        pending = sum(int(rows.shape[0]) for rows in drafter._pending)
        assert cache_length(drafter._cache) == drafter._fed
        assert drafter._fed + pending == len(tokens) - 1
    assert 0 in accepted_counts and max(accepted_counts) >= 2  # every kind of rewind ran


def test_drafts_are_checked_by_the_recorded_proposals(target, loaded, prompt, head):
    """Every proposal the engine asks for equals the from-scratch reference."""
    drafter = HeadDrafter(head, loaded)
    seen: list[tuple[list[int], list[int]]] = []
    propose = drafter.propose

    def recording(request):
        proposal = propose(request)
        seen.append((list(request.tokens), proposal.tokens.tolist()))
        return proposal

    drafter.propose = recording  # type: ignore[method-assign]
    SpeculativeDecoder(loaded, drafter=drafter, policy=FixedK(3)).generate(
        prompt, max_new_tokens=24
    )
    assert seen
    for tokens, drafts in seen:
        assert drafts == reference_drafts(head, target, tokens, len(drafts))


def test_a_missing_prefill_is_reported(loaded, prompt, random_head):
    drafter = HeadDrafter(random_head, loaded)
    drafter.begin(prompt)
    with pytest.raises(SpecOpsError, match="prefill"):
        drafter.propose(DraftRequest(prompt, 2, GREEDY))
    with pytest.raises(SpecOpsError, match="first 11 tokens"):
        drafter.prefill(torch.zeros(3, 32))


# ----------------------------------------------------------------------------- sampling


def test_sampling_draft_probs_cover_the_full_vocabulary(target, loaded, prompt, trained_heads):
    head = trained_heads["reduced"]
    sampler = make_sampler(SamplingParams(temperature=0.8, top_p=0.95, seed=0))
    drafter = HeadDrafter(head, loaded)
    drafter.begin(prompt)
    drafter.prefill(prompt_hidden(target, prompt))
    proposal = drafter.propose(DraftRequest(prompt, 4, sampler))
    assert proposal.draft_probs is not None and proposal.draft_probs.shape == (4, VOCAB)
    torch.testing.assert_close(proposal.draft_probs.sum(-1), torch.ones(4))
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[head.vocab_ids] = False
    assert (proposal.draft_probs[:, outside] == 0).all()
    picked = proposal.draft_probs[torch.arange(4), proposal.tokens]
    assert (picked > 0).all()


@pytest.mark.parametrize("vocab", ["full", "reduced"])
def test_sampling_with_the_head_runs(loaded, prompt, trained_heads, vocab):
    drafter = HeadDrafter(trained_heads[vocab], loaded)
    decoder = SpeculativeDecoder(loaded, drafter=drafter, policy=FixedK(3))
    params = SamplingParams(temperature=0.7, top_k=20, seed=3)
    first = decoder.generate(prompt, max_new_tokens=32, sampling=params)
    again = decoder.generate(prompt, max_new_tokens=32, sampling=params)
    assert len(first.token_ids) == 32 and first.stats.draft_tokens > 0
    assert first.token_ids == again.token_ids  # seeded: reproducible


# ------------------------------------------------------------------ on the lean step


@pytest.fixture(scope="module", params=KERNELS)
def lean_loaded(request) -> LoadedTarget:
    """The ``target`` fixture's model (``tiny_llama()``'s weights) on the lean step."""
    return tiny_target(request.param, hidden_size=32, intermediate_size=64, num_layers=4)


@pytest.mark.parametrize("vocab", ["full", "reduced"])
def test_lean_targets_draft_on_the_lean_head_step_exactly(
    lean_loaded, prompt, trained_heads, vocab
):
    plain = SpeculativeDecoder(lean_loaded).generate(prompt, max_new_tokens=NEW_TOKENS).token_ids
    drafter = HeadDrafter(trained_heads[vocab], lean_loaded)
    assert isinstance(drafter.step, LeanHeadStep)
    for k in (1, 3, 6):
        decoder = SpeculativeDecoder(lean_loaded, drafter=drafter, policy=FixedK(k))
        result = decoder.generate(prompt, max_new_tokens=NEW_TOKENS)
        assert result.token_ids == plain, k
        assert result.stats.accepted_tokens > 0, k


def test_lean_head_drafts_keep_the_sampled_distribution(prompt, trained_heads):
    """Two sampled tokens, 600 seeds: each position's counts against the target's own
    distribution (chi-square), drafts from the lean head step on an int4 target."""
    lean = tiny_target("int4", hidden_size=32, intermediate_size=64, num_layers=4)
    drafter = HeadDrafter(trained_heads["reduced"], lean)
    assert isinstance(drafter.step, LeanHeadStep)
    sampler = make_sampler(SamplingParams(1.0, top_k=6))
    with torch.inference_mode():
        cache = lean.new_cache()
        logits = lean(input_ids=torch.tensor([prompt]), past_key_values=cache).logits[0, -1:]
        first = sampler.probs(logits)[0]
        support = first.nonzero().flatten().tolist()
        follow = []
        for token in support:
            cache = lean.new_cache()
            out = lean(input_ids=torch.tensor([[*prompt, token]]), past_key_values=cache)
            follow.append(sampler.probs(out.logits[0, -1:])[0])
        second = (first[support, None] * torch.stack(follow)).sum(0)
    decoder = SpeculativeDecoder(lean, drafter=drafter, policy=FixedK(2))
    results = [
        decoder.generate(prompt, max_new_tokens=2, sampling=SamplingParams(1.0, top_k=6, seed=s))
        for s in range(600)
    ]
    tokens = np.array([r.token_ids for r in results])
    assert sum(r.stats.draft_tokens for r in results) > 0
    assert chisquare_pvalue(np.bincount(tokens[:, 0], minlength=VOCAB), first) > P_MIN
    assert chisquare_pvalue(np.bincount(tokens[:, 1], minlength=VOCAB), second) > P_MIN


def test_a_target_off_the_lean_step_drafts_through_transformers(loaded, trained_heads):
    assert isinstance(HeadDrafter(trained_heads["full"], loaded).step, TransformersHead)


# ---------------------------------------------------------------------------- save/load


def test_save_load_roundtrip(target, prompt, head, tmp_path):
    path = save_head(head, tmp_path / "head")
    assert sorted(p.name for p in path.iterdir()) == sorted([CONFIG_FILE, WEIGHTS_FILE])
    loaded = load_head(path, target)
    assert loaded.head_config == head.head_config
    original, reloaded = head.state_dict(), loaded.state_dict()
    assert original.keys() == reloaded.keys()
    for name in original:
        assert torch.equal(original[name], reloaded[name]), name
    assert not any(name.startswith(("embed", "lm_head")) for name in reloaded)  # head only
    assert reference_drafts(loaded, target, prompt, 4) == reference_drafts(head, target, prompt, 4)


def test_loading_for_another_target_names_the_mismatch(random_head, tmp_path):
    path = save_head(random_head, tmp_path / "head")
    with pytest.raises(IncompatibleDraftError, match=r"hidden size 32.*hidden size is 48"):
        load_head(path, tiny_llama(hidden_size=48))
    with pytest.raises(IncompatibleDraftError, match="96 tokens but the target has 64"):
        load_head(path, tiny_llama(vocab_size=64))


def test_corrupt_or_missing_files_raise_model_source_error(target, random_head, tmp_path):
    with pytest.raises(ModelSourceError, match=r"head_config\.json is missing"):
        load_head(tmp_path / "nothing", target)
    path = save_head(random_head, tmp_path / "head")
    (path / WEIGHTS_FILE).write_bytes(b"not a safetensors file")
    with pytest.raises(ModelSourceError, match="corrupt"):
        load_head(path, target)
    (path / WEIGHTS_FILE).unlink()
    with pytest.raises(ModelSourceError, match="missing"):
        load_head(path, target)
    (path / CONFIG_FILE).write_text("{not json")
    with pytest.raises(ModelSourceError, match="corrupt"):
        load_head(path, target)


# ------------------------------------------------------------------------------ factory


def test_factory_builds_a_head_drafter(loaded, prompt, greedy_reference, random_head, tmp_path):
    path = save_head(random_head, tmp_path / "head")
    assert parse_drafter_spec(f"head:{path}").kind == "head"
    drafter = build_drafter(f"head:{path}", loaded)
    assert isinstance(drafter, HeadDrafter) and drafter.needs_target_hidden
    assert drafter.describe()["kind"] == "head"
    decoder = SpeculativeDecoder(loaded, drafter=drafter, policy=FixedK(2))
    assert decoder.generate(prompt, max_new_tokens=NEW_TOKENS).token_ids == greedy_reference


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [("head", "needs a path"), ("head:/no/such/folder", "is not a draft-head folder")],
)
def test_factory_rejects_bad_head_specs(spec, fragment):
    with pytest.raises(BadInputError, match=fragment):
        parse_drafter_spec(spec)


# ------------------------------------------------------------------------- real model


@pytest.mark.real_model
@pytest.mark.parametrize("draft_vocab", [None, 8192])
def test_head_drafter_is_lossless_on_the_real_model(real_packed, real_prompts, draft_vocab):
    """The hidden-state plumbing on the packed real target (an untrained head: it only
    exercises rejections; trained-head numbers come from `python -m benchmarks.draft_curves`)."""
    target = real_packed
    torch.manual_seed(0)
    vocab_ids = None if draft_vocab is None else torch.randperm(49152)[:draft_vocab]
    head = DraftHead(head_config_for(target.model, draft_vocab_size=draft_vocab), vocab_ids).eval()
    # No end-of-sequence ids: both decode 24 tokens.
    plain = SpeculativeDecoder(target, eos_token_ids=())
    drafted = SpeculativeDecoder(
        target, drafter=HeadDrafter(head, target), policy=FixedK(4), eos_token_ids=()
    )
    for prompt in real_prompts:
        expected = plain.generate(prompt, max_new_tokens=24).token_ids
        result = drafted.generate(prompt, max_new_tokens=24)
        assert result.token_ids == expected
        assert result.stats.draft_tokens > 0
