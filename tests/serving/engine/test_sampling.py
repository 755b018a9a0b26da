import math

import pytest
import torch

from serving.engine.sampling import (
    SamplingParams,
    make_sampler,
    temperature_processor,
    top_k_processor,
    top_p_processor,
)
from serving.errors import BadInputError


def kept(logits: torch.Tensor) -> set[int]:
    return set(torch.isfinite(logits).nonzero().flatten().tolist())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.5),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("temperature", "hot"),
        ("top_p", 0.0),
        ("top_p", -0.2),
        ("top_p", 1.5),
        ("top_p", float("nan")),
        ("top_k", -1),
        ("top_k", 2.5),
        ("top_k", True),
    ],
)
def test_sampling_params_reject_bad_values_naming_them(field, value):
    with pytest.raises(BadInputError) as excinfo:
        SamplingParams(**{field: value})
    message = str(excinfo.value)
    assert field in message
    assert repr(value) in message


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(temperature=0.7, top_k=0, top_p=1.0),
        SamplingParams(temperature=1.3, top_k=5, top_p=0.01, seed=3),
    ],
)
def test_sampling_params_accept_edge_values(params):
    assert params.greedy == (params.temperature == 0)


def test_top_k_keeps_the_k_largest_logits():
    logits = torch.tensor([1.0, 5.0, 3.0, 4.0, 2.0])
    assert kept(top_k_processor(1)(logits)) == {1}
    assert kept(top_k_processor(2)(logits)) == {1, 3}
    assert kept(top_k_processor(3)(logits)) == {1, 2, 3}
    assert kept(top_k_processor(50)(logits)) == {0, 1, 2, 3, 4}  # k above the vocabulary


def test_top_k_leaves_kept_logits_unchanged_and_works_per_row():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0], [9.0, -1.0, 0.0, 8.0]])  # [2, vocab]
    out = top_k_processor(2)(logits)
    assert torch.isinf(out).tolist() == [[True, False, True, False], [False, True, True, False]]
    assert out[0, 1] == 5.0 and out[1, 3] == 8.0


@pytest.mark.parametrize(
    ("top_p", "expected"),
    [
        (0.3, {0}),  # the top token alone already reaches 0.3
        (0.6, {0, 2}),  # 0.5 < 0.6 needs the second: 0.75
        (0.8, {0, 2, 3}),  # 0.75 < 0.8 needs the third: 0.9
        (0.95, {0, 1, 2, 3}),
    ],
)
def test_top_p_keeps_the_smallest_set_reaching_the_mass(top_p, expected):
    probs = torch.tensor([0.5, 0.1, 0.25, 0.15])
    assert kept(top_p_processor(top_p)(probs.log())) == expected


def test_top_p_works_per_row():
    probs = torch.tensor([[0.5, 0.1, 0.25, 0.15], [0.05, 0.7, 0.05, 0.2]])
    out = top_p_processor(0.6)(probs.log())
    assert torch.isfinite(out).tolist() == [[True, False, True, False], [False, True, False, False]]


def test_composed_sampler_applies_temperature_then_top_k_then_top_p():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 3.0])
    sampler = make_sampler(SamplingParams(temperature=0.5, top_k=3, top_p=0.9, seed=0))
    probs = sampler.probs(logits)
    # T = 0.5 -> [4, 2, 0, -2, 6]; top-3 keeps tokens 4, 0, 1 with softmax
    # [0.867, 0.117, 0.016]; 0.867 < 0.9 so top-p also needs token 0 (mass 0.984), not 1.
    scaled = temperature_processor(0.5)(logits)
    top3 = scaled[[4, 0, 1]].softmax(-1)
    assert top3[0] < 0.9 <= top3[0] + top3[1]
    expected = torch.zeros(5)
    expected[[4, 0]] = scaled[[4, 0]].softmax(-1)
    torch.testing.assert_close(probs, expected)
    assert probs.sum().item() == pytest.approx(1.0)


def test_temperature_scales_the_softmax():
    logits = torch.tensor([[0.3, -1.2, 2.0, 0.0]])
    for temperature in (0.25, 1.0, 3.0):
        sampler = make_sampler(SamplingParams(temperature=temperature, seed=0))
        torch.testing.assert_close(sampler.probs(logits), (logits / temperature).softmax(-1))


def test_greedy_sampler_picks_the_argmax():
    sampler = make_sampler()
    assert sampler.greedy and sampler.generator is None
    logits = torch.tensor([[0.1, 3.0, -2.0, 2.9], [5.0, 0.0, 0.0, 4.0], [0.0, 0.0, 0.0, 0.1]])
    assert sampler(logits).tolist() == [1, 0, 3]
    probs = sampler.probs(logits)  # one-hot at the argmax
    assert probs.argmax(-1).tolist() == [1, 0, 3]
    assert probs.sum(-1).tolist() == [1.0, 1.0, 1.0]
    assert sampler.sample(probs).tolist() == [1, 0, 3]


def draws(seed: int | None, n: int = 200) -> list[int]:
    sampler = make_sampler(SamplingParams(temperature=1.0, seed=seed))
    logits = torch.zeros(n, 10)  # uniform: every draw is informative
    return sampler(logits).tolist()


def test_seeded_sampler_is_reproducible():
    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
    first = make_sampler(SamplingParams(temperature=0.9, seed=11))
    second = make_sampler(SamplingParams(temperature=0.9, seed=11))
    assert torch.equal(first.uniform(16), second.uniform(16))


def test_sampler_never_draws_a_masked_token():
    sampler = make_sampler(SamplingParams(temperature=2.0, top_k=2, seed=0))
    logits = torch.tensor([0.0, 1.0, 0.5, 3.0, -1.0]).expand(500, 5)
    assert set(sampler(logits).tolist()) == {1, 3}
    assert math.isclose(float(sampler.probs(logits[0]).sum()), 1.0, rel_tol=1e-6)
