"""The verifier: exact greedy acceptance and a statistical test of the rejection sampler.

The statistical tests draw drafts from a draft distribution that differs from the target's
(and puts mass where the target has none), run ``verify_sampled`` once per trial, and
compare the first emitted token (the accepted draft or the resampled token) with the
target's processed distribution ``sampler.probs(target_logits)`` by a chi-square test.
Seeds are fixed, so each test is deterministic; a deliberately wrong verifier fails the
same test, which shows it has power.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from serving.engine.sampling import Sampler, SamplingParams, make_sampler
from serving.engine.verify import Verdict, verify, verify_greedy, verify_sampled

TRIALS = 25_000
P_MIN = 1e-3

# One target row and one draft row over an 8-token vocabulary; later draft positions use
# rotated copies so that every position has a different pair.
TARGET_LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, 1.5, -1.0, 0.2])
DRAFT_LOGITS = torch.tensor([0.0, 1.5, 1.0, 0.5, 0.8, -0.5, 1.2, 0.0])
VOCAB = TARGET_LOGITS.shape[0]

CASES = {
    "temperature": SamplingParams(temperature=0.7, seed=1),
    "top_k": SamplingParams(temperature=1.0, top_k=3, seed=2),
    "top_p": SamplingParams(temperature=1.3, top_p=0.8, seed=3),
    "one_hot": SamplingParams(temperature=0.9, top_k=5, seed=4),  # draft_probs=None
}

Verifier = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor, Sampler], Verdict]


def logits_with_argmax(choices: list[int], vocab: int = 6) -> torch.Tensor:
    """``[len(choices), vocab]`` logits whose row ``i`` peaks at ``choices[i]``."""
    logits = torch.randn(len(choices), vocab, generator=torch.Generator().manual_seed(0))
    logits[torch.arange(len(choices)), choices] = 10.0
    return logits


# --- greedy ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("drafts", "accepted_len", "next_token"),
    [
        ([3, 1, 4], 3, 0),  # full match: the bonus token is the last row's argmax
        ([3, 2, 4], 1, 1),  # first mismatch at index 1 (the later match does not count)
        ([5, 1, 4], 0, 3),  # zero match
        ([3, 1, 5], 2, 4),
        ([], 0, 3),  # nothing drafted: plain decoding
    ],
)
def test_verify_greedy(drafts, accepted_len, next_token):
    target_logits = logits_with_argmax([3, 1, 4, 0][: len(drafts) + 1])  # [k + 1, vocab]
    verdict = verify_greedy(torch.tensor(drafts, dtype=torch.int64), target_logits)
    assert verdict == Verdict(accepted_len, next_token)
    assert verdict.next_token == int(target_logits[accepted_len].argmax())


def test_verify_dispatches_on_the_sampler():
    target_logits = logits_with_argmax([3, 1, 4])
    drafts = torch.tensor([3, 1])
    verdict, probs = verify(drafts, None, target_logits, make_sampler())
    assert verdict == Verdict(2, 4) and probs is None

    sampler = make_sampler(SamplingParams(temperature=0.8, seed=0))
    verdict, probs = verify(drafts, None, target_logits, sampler)
    torch.testing.assert_close(probs, make_sampler(sampler.params).probs(target_logits))
    assert 0 <= verdict.accepted_len <= 2


# --- sampled: exact cases --------------------------------------------------------------


def test_draft_identical_to_target_is_always_accepted():
    sampler = make_sampler(SamplingParams(temperature=1.0, seed=0))
    target_probs = sampler.probs(torch.stack([TARGET_LOGITS.roll(i) for i in range(4)]))
    gen = torch.Generator().manual_seed(0)
    for _ in range(500):
        drafts = torch.stack(
            [torch.multinomial(row, 1, generator=gen)[0] for row in target_probs[:3]]
        )
        verdict = verify_sampled(drafts, target_probs[:3], target_probs, sampler)
        assert verdict.accepted_len == 3


@pytest.mark.parametrize("one_hot", [False, True])
def test_draft_with_zero_target_probability_is_always_rejected(one_hot):
    sampler = make_sampler(SamplingParams(temperature=1.0, top_k=2, seed=0))
    target_probs = sampler.probs(TARGET_LOGITS[None].expand(2, VOCAB))  # [2, vocab]
    draft_probs = None if one_hot else DRAFT_LOGITS.softmax(-1)[None]
    seen = set()
    for _ in range(500):
        verdict = verify_sampled(torch.tensor([4]), draft_probs, target_probs, sampler)
        assert verdict.accepted_len == 0
        seen.add(verdict.next_token)
    assert seen == {0, 5}  # the target's top 2


# --- sampled: statistics ---------------------------------------------------------------


def chisquare_pvalue(counts: np.ndarray, probs: torch.Tensor) -> float:
    """Chi-square of ``counts`` against ``probs``; zero-probability tokens must never occur.

    Bins with an expected count below 5 are merged into one.
    """
    probs_np = probs.double().numpy()
    support = probs_np > 0
    assert counts[~support].sum() == 0, f"zero-probability tokens drawn: {counts[~support]}"
    expected = probs_np[support] / probs_np[support].sum() * counts.sum()
    observed = counts[support].astype(np.float64)
    small = expected < 5
    if small.any():
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
    if len(observed) < 2:
        return 1.0
    return float(chisquare(observed, expected).pvalue)


def run_trials(
    sampler: Sampler,
    target_probs: torch.Tensor,  # [k + 1, vocab]
    draft_probs: torch.Tensor,  # [k, vocab] what the drafts are drawn from
    *,
    one_hot: bool = False,
    verifier: Verifier = verify_sampled,
    trials: int = TRIALS,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Counts of the first emitted token, and of the bonus token when all drafts were kept."""
    k = draft_probs.shape[0]
    gen = torch.Generator().manual_seed(seed)
    drafts = torch.stack(
        [torch.multinomial(row, trials, replacement=True, generator=gen) for row in draft_probs],
        dim=1,
    )  # [trials, k]
    passed_probs = None if one_hot else draft_probs
    first = np.zeros(VOCAB, dtype=np.int64)
    bonus = np.zeros(VOCAB, dtype=np.int64)
    for draft_tokens in drafts:
        verdict = verifier(draft_tokens, passed_probs, target_probs, sampler)
        token = int(draft_tokens[0]) if verdict.accepted_len > 0 else verdict.next_token
        first[token] += 1
        if verdict.accepted_len == k:
            bonus[verdict.next_token] += 1
    return first, bonus


def distributions(case: str, k: int) -> tuple[Sampler, torch.Tensor, torch.Tensor]:
    sampler = make_sampler(CASES[case])
    target_probs = sampler.probs(torch.stack([TARGET_LOGITS.roll(i) for i in range(k + 1)]))
    draft_probs = torch.stack([DRAFT_LOGITS.roll(i) for i in range(k)]).softmax(-1)
    return sampler, target_probs, draft_probs


@pytest.mark.parametrize(
    ("case", "k"),
    [
        ("temperature", 1),
        ("temperature", 3),
        ("top_k", 1),
        ("top_k", 2),
        ("top_p", 1),
        ("top_p", 3),
        ("one_hot", 1),
        ("one_hot", 2),
    ],
)
def test_sampled_verify_emits_the_target_distribution(case, k):
    sampler, target_probs, draft_probs = distributions(case, k)
    if case != "temperature":
        # The draft puts real mass where the target has none, so those must be rejected.
        assert draft_probs[0][target_probs[0] == 0].sum() > 0.2
    first, bonus = run_trials(sampler, target_probs, draft_probs, one_hot=case == "one_hot")
    assert first.sum() == TRIALS
    assert chisquare_pvalue(first, target_probs[0]) > P_MIN
    assert bonus.sum() > 100  # enough fully accepted blocks for the bonus check
    assert chisquare_pvalue(bonus, target_probs[k]) > P_MIN


@pytest.mark.parametrize("draft_token", [0, 2])
def test_one_hot_verify_is_exact_for_each_fixed_draft(draft_token):
    # A deterministic drafter's output must be the target's distribution whatever it drafts,
    # not only on average over drafts.
    sampler, target_probs, _ = distributions("one_hot", 1)
    assert 0 < target_probs[0, draft_token] < 0.5
    fixed = torch.zeros(1, VOCAB)
    fixed[0, draft_token] = 1.0
    first, _ = run_trials(sampler, target_probs, fixed, one_hot=True, trials=15_000)
    assert chisquare_pvalue(first, target_probs[0]) > P_MIN


# --- the test has power: wrong verifiers fail it ----------------------------------------


def accept_everything(draft_tokens, draft_probs, target_probs, sampler) -> Verdict:
    k = draft_tokens.shape[0]
    return Verdict(k, int(sampler.sample(target_probs[k])))


def resample_from_target(draft_tokens, draft_probs, target_probs, sampler) -> Verdict:
    """Right acceptance rule, but draws a rejected position from the target, not the residual."""
    k = draft_tokens.shape[0]
    rows = torch.arange(k)
    keep = sampler.uniform(k) * draft_probs[rows, draft_tokens] < target_probs[rows, draft_tokens]
    accepted_len = int(keep.to(torch.int64).cumprod(0).sum())
    return Verdict(accepted_len, int(sampler.sample(target_probs[accepted_len])))


def swapped_ratio(draft_tokens, draft_probs, target_probs, sampler) -> Verdict:
    """Confuses draft and target: accepts with min(1, draft / target), residual draft - target."""
    k = draft_tokens.shape[0]
    swapped_target = torch.cat([draft_probs, target_probs[k:]])  # [k + 1, vocab]
    return verify_sampled(draft_tokens, target_probs[:k], swapped_target, sampler)


@pytest.mark.parametrize("wrong", [accept_everything, resample_from_target, swapped_ratio])
def test_wrong_verifiers_fail_the_statistical_test(wrong):
    sampler, target_probs, draft_probs = distributions("temperature", 1)
    first, _ = run_trials(sampler, target_probs, draft_probs, verifier=wrong)
    assert chisquare_pvalue(first, target_probs[0]) < P_MIN
