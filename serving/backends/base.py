"""The backend interface: load a target (and a draft), generate greedily with or without
speculation, and report what the drafts achieved.

This module imports neither torch nor any backend library: every backend runs in its own
environment (vLLM and MLX pin versions the main environment cannot hold), and they all
share these types. Statistics follow :mod:`serving.engine.metrics`; a backend that only counts
accepted tokens (vLLM, MLX) derives its verification passes as ``generated - accepted``,
because every pass emits its accepted drafts plus one token of the target's own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from serving.errors import BadInputError, SpecOpsError

METHODS = ("none", "ngram", "draft_model", "suffix", "eagle")
Method = Literal["none", "ngram", "draft_model", "suffix", "eagle"]
MAX_SPECULATIVE_TOKENS = 16


class BackendUnavailableError(SpecOpsError, RuntimeError):
    """A backend's library is not installed in this environment."""


class UnsupportedDraftError(SpecOpsError, ValueError):
    """A backend cannot load this kind of draft (raised before any model work)."""


@dataclass(frozen=True)
class Speculation:
    """What to draft with, in terms every backend understands.

    ``ngram``: prompt lookup over the request (vLLM's ``ngram`` method; specops's ``pld``).
    ``draft_model``: a causal LM folder sharing the target's tokenizer, in the backend's
    format (see :mod:`tasks.evaluate.export`).
    ``suffix``: suffix decoding over the request and the server's earlier responses (vLLM's
    ``suffix`` method, Arctic Inference's suffix trees; specops's ``suffix``), with its
    four ``suffix_*`` settings (vLLM's ``suffix_decoding_*`` keys).
    ``eagle``: an EAGLE-1 head folder (vLLM's ``eagle`` method; specops's ``head`` in the
    ``eagle`` layout, see :mod:`tasks.evaluate.eagle_export`).
    """

    method: Method = "none"
    num_speculative_tokens: int = 0
    prompt_lookup_max: int = 3
    prompt_lookup_min: int = 1
    draft_path: str | None = None
    suffix_max_tree_depth: int = 24
    suffix_max_spec_factor: float = 1.0
    suffix_min_token_prob: float = 0.1
    suffix_max_cached_requests: int = 10000

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise BadInputError(f"unknown speculation method {self.method!r}; use {METHODS}")
        if self.method == "none":
            return
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise BadInputError(
                f"num_speculative_tokens must be in 1..{MAX_SPECULATIVE_TOKENS}, got "
                f"{self.num_speculative_tokens!r}"
            )
        if self.method in ("draft_model", "eagle") and not self.draft_path:
            raise BadInputError(f"speculation method {self.method!r} needs a draft_path")
        if self.method == "suffix":
            self._check_suffix()
        if self.method == "ngram" and not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise BadInputError(
                f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                f"{self.prompt_lookup_min}, {self.prompt_lookup_max}"
            )

    def _check_suffix(self) -> None:
        if not self.num_speculative_tokens <= self.suffix_max_tree_depth:
            raise BadInputError(
                f"suffix_max_tree_depth ({self.suffix_max_tree_depth!r}) must be >= "
                f"num_speculative_tokens ({self.num_speculative_tokens})"
            )
        if not self.suffix_max_spec_factor > 0:
            raise BadInputError(
                f"suffix_max_spec_factor must be > 0, got {self.suffix_max_spec_factor!r}"
            )
        if not 0.0 <= self.suffix_min_token_prob <= 1.0:
            raise BadInputError(
                f"suffix_min_token_prob must be in [0, 1], got {self.suffix_min_token_prob!r}"
            )
        if self.suffix_max_cached_requests < 0:
            raise BadInputError(
                "suffix_max_cached_requests must be >= 0 (0: no global tree), got "
                f"{self.suffix_max_cached_requests!r}"
            )

    @property
    def speculative(self) -> bool:
        return self.method != "none"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Speculation:
        try:
            return cls(**raw)
        except TypeError as error:
            raise BadInputError(f"bad speculation {raw!r}: {error}") from None


@dataclass
class BackendOutput:
    """One greedy generation, with its speculation counts (zeros without a draft)."""

    token_ids: list[int]
    seconds: float
    checks: int  # target verification passes
    draft_tokens: int
    accepted_tokens: int
    # Per draft position: checks that proposed a token there, and those whose token was kept.
    reached_by_position: list[int] = field(default_factory=list)
    kept_by_position: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Backend(ABC):
    """One loaded target, with or without a draft. Greedy only: that is what the backends
    guarantee to reproduce token for token."""

    name: str = "backend"

    def __init__(
        self,
        target_path: str,
        speculation: Speculation,
        *,
        threads: int = 2,
        dtype: str = "float32",
        device: str = "cpu",
        seed: int = 0,
    ) -> None:
        self.target_path = target_path
        self.speculation = speculation
        self.threads = threads
        self.dtype = dtype
        self.device = device
        self.seed = seed

    @abstractmethod
    def _generate(self, prompt: list[int], max_new_tokens: int) -> BackendOutput: ...

    def generate(self, prompt: list[int], max_new_tokens: int) -> BackendOutput:
        if not prompt or not all(isinstance(t, int) and t >= 0 for t in prompt):
            raise BadInputError("a prompt must be a non-empty list of token ids >= 0")
        if max_new_tokens < 1:
            raise BadInputError(f"max_new_tokens must be >= 1, got {max_new_tokens!r}")
        return self._generate(list(prompt), max_new_tokens)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the engine (most backends free everything on garbage collection)."""


def checks_from_flags(from_draft: list[bool], k: int) -> BackendOutput:
    """Counts for a stream whose tokens say whether they were an accepted draft: each
    verification pass yields its accepted drafts, then one token of the target's own."""
    kept = [0] * k
    checks = accepted = 0
    run = 0
    for flag in from_draft:
        if flag:
            run += 1
            continue
        checks += 1
        for i in range(min(run, k)):
            kept[i] += 1
        accepted += run
        run = 0
    if run:  # the budget ended the output inside a pass
        checks += 1
        accepted += run
        for i in range(min(run, k)):
            kept[i] += 1
    return BackendOutput(
        token_ids=[],
        seconds=0.0,
        checks=checks,
        draft_tokens=checks * k if k else 0,
        accepted_tokens=accepted,
        reached_by_position=[checks] * k,
        kept_by_position=kept,
    )
