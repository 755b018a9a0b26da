"""Samplers as composable callables.

``make_sampler(temperature, top_k, top_p)`` returns one :class:`Sampler`. Its ``probs`` turns
raw logits into the processed distribution that tokens are drawn from; the verifier uses
exactly that distribution (otherwise speculative sampling would not be lossless). Greedy
decoding is ``temperature == 0``: the sampler then picks the argmax and never draws.

Draws come from the request's ``torch.Generator``, made on the device of the tensors it
samples (the target's): a CUDA tensor cannot be drawn from with a CPU generator, and
drawing on the device keeps a model drafter's loop free of a host sync per token. A seed
therefore reproduces within one device type; CPU and CUDA generators give different draws.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from serving.errors import BadInputError

LogitsProcessor = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. ``temperature == 0`` means greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0 disables top-k
    top_p: float = 1.0  # 1.0 disables top-p
    seed: int | None = None

    def __post_init__(self) -> None:
        if (
            isinstance(self.temperature, bool)
            or not isinstance(self.temperature, int | float)
            or not math.isfinite(self.temperature)
        ):
            raise BadInputError(f"temperature must be a finite number, got {self.temperature!r}")
        if self.temperature < 0:
            raise BadInputError(
                f"temperature must be >= 0 (0 means greedy), got {self.temperature!r}"
            )
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise BadInputError(f"top_k must be an integer >= 0 (0 disables), got {self.top_k!r}")
        if (
            isinstance(self.top_p, bool)
            or not isinstance(self.top_p, int | float)
            or not (0.0 < self.top_p <= 1.0)
        ):
            raise BadInputError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def temperature_processor(temperature: float) -> LogitsProcessor:
    def apply(logits: torch.Tensor) -> torch.Tensor:
        return logits / temperature

    return apply


def top_k_processor(top_k: int) -> LogitsProcessor:
    def apply(logits: torch.Tensor) -> torch.Tensor:
        k = min(top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # [..., 1]
        return logits.masked_fill(logits < kth, float("-inf"))

    return apply


def top_p_processor(top_p: float) -> LogitsProcessor:
    """Keep the smallest set of most probable tokens whose mass reaches ``top_p``."""

    def apply(logits: torch.Tensor) -> torch.Tensor:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [..., vocab]
        drop_sorted = mass_before >= top_p  # the top token always has mass_before == 0
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        return logits.masked_fill(drop, float("-inf"))

    return apply


def compose(processors: list[LogitsProcessor]) -> LogitsProcessor:
    def apply(logits: torch.Tensor) -> torch.Tensor:
        for processor in processors:
            logits = processor(logits)
        return logits

    return apply


@dataclass
class Sampler:
    """Processed distributions and draws for one request. Built by :func:`make_sampler`."""

    params: SamplingParams
    process: LogitsProcessor
    generator: torch.Generator | None = field(default=None, repr=False)

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    @property
    def device(self) -> torch.device | None:
        """Where this sampler draws (its generator's device); ``None`` when greedy."""
        return None if self.generator is None else self.generator.device

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution tokens are drawn from. Greedy: one-hot at the argmax."""
        if self.greedy:
            return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(
                logits.dtype
            )
        return self.process(logits.float()).softmax(dim=-1)

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        """Draw one token per row of ``probs`` ``[..., vocab]`` -> ``[...]``."""
        if self.greedy:
            return probs.argmax(dim=-1)
        flat = probs.reshape(-1, probs.shape[-1])
        drawn = torch.multinomial(flat, 1, generator=self.generator)
        return drawn.reshape(probs.shape[:-1])

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """Pick the next token from raw logits ``[..., vocab]``."""
        if self.greedy:
            return logits.argmax(dim=-1)
        return self.sample(self.probs(logits))

    def uniform(self, n: int) -> torch.Tensor:
        """``n`` uniforms in [0, 1) from this request's generator (for acceptance tests)."""
        device = self.device or torch.device("cpu")
        return torch.rand(n, generator=self.generator, device=device)


def make_sampler(
    params: SamplingParams | None = None,
    *,
    device: torch.device | str = "cpu",
    **kwargs: object,
) -> Sampler:
    """Compose temperature, top-k and top-p into one sampler (HF's order: T, then k, then p).
    ``device``: where its draws are made, the device of the logits it will see."""
    if params is None:
        params = SamplingParams(**kwargs)  # type: ignore[arg-type]
    processors: list[LogitsProcessor] = []
    if not params.greedy:
        if params.temperature != 1.0:
            processors.append(temperature_processor(params.temperature))
        if params.top_k > 0:
            processors.append(top_k_processor(params.top_k))
        if params.top_p < 1.0:
            processors.append(top_p_processor(params.top_p))
    generator = None
    if not params.greedy:
        generator = torch.Generator(device=device)
        generator.manual_seed(params.seed if params.seed is not None else torch.seed())
    return Sampler(params=params, process=compose(processors), generator=generator)
