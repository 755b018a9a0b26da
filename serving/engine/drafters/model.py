"""A model draft: any causal LM that shares the target's vocabulary.

It keeps its own KV cache. Proposing feeds the committed tokens its cache has not seen yet,
then drafts autoregressively; ``commit`` rewinds the cache to the longest prefix the target
kept. The cache never holds the last drafted token (it was sampled, not fed), so after a
fully accepted block the next ``propose`` feeds that token together with the bonus token.

It runs on its model's device; :func:`load_model_drafter` loads a ``model:PATH`` draft onto
its target's, so its drafts and probabilities meet the target's logits without a copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch

from serving.engine.drafters.base import (
    Drafter,
    DraftProposal,
    DraftRequest,
    StepFeedback,
    draw_draft,
)
from serving.engine.kv import Cache, cache_length, rewind
from serving.errors import BadInputError, IncompatibleDraftError
from serving.models.kernels import apply_kernels
from serving.target import LoadedTarget

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class ModelDrafter(Drafter):
    kind = "model"  # also a ``layers:N`` draft: a model cut from the target
    deterministic = False

    def __init__(
        self, model: LoadedTarget, *, name: str = "model", confidence_threshold: float = 0.0
    ) -> None:
        """``model``: the draft served like its target (:meth:`LoadedTarget.over`): a
        ``layers:N`` draft on the target's own kind of lean step."""
        if not 0.0 <= confidence_threshold < 1.0:
            raise BadInputError(
                f"confidence_threshold must be in [0, 1), got {confidence_threshold!r}"
            )
        self.model = model
        # Where the draft runs (for a served draft, its target's device: see build_drafter).
        self.device: torch.device = model.device
        self.name = name
        self.confidence_threshold = confidence_threshold
        self._cache: Cache | None = None
        self._proposal_base = 0  # committed length when the last proposal was made
        self._proposed = 0

    def check_compatible(self, target_vocab_size: int) -> None:
        draft_vocab = self.model.config.vocab_size
        if draft_vocab != target_vocab_size:
            raise IncompatibleDraftError(
                f"draft {self.name!r} has a vocabulary of {draft_vocab} tokens but the target "
                f"has {target_vocab_size}; a draft must share the target's tokenizer"
            )

    def begin(self, prompt: list[int]) -> None:
        self._cache = self.model.new_cache()
        self._proposal_base = 0
        self._proposed = 0

    def end(self) -> None:
        self._cache = None

    def _next_logits(self, new_tokens: torch.Tensor) -> torch.Tensor:
        out = self.model(
            input_ids=new_tokens[None],  # [1, n]
            past_key_values=self._cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[0, -1]  # [vocab]

    @torch.inference_mode()
    def propose(self, request: DraftRequest) -> DraftProposal:
        assert self._cache is not None, "begin() was not called"
        sampler = request.sampler
        unseen = torch.tensor(
            request.tokens[cache_length(self._cache) :], dtype=torch.int64, device=self.device
        )  # [n]
        logits = self._next_logits(unseen)
        tokens: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        for i in range(request.k):
            token, row = draw_draft(logits, sampler)  # row [vocab]
            tokens.append(token)
            probs.append(row)
            last = i == request.k - 1
            if last or (
                self.confidence_threshold and float(row[token]) < self.confidence_threshold
            ):
                break
            logits = self._next_logits(token.view(1))
        self._proposal_base = len(request.tokens)
        self._proposed = len(tokens)
        return DraftProposal(torch.stack(tokens), draft_probs=torch.stack(probs))

    def commit(self, feedback: StepFeedback) -> None:
        # Its own count, not the step's: a step may use fewer drafts than were drafted
        # (cut to the budget, or at a token a constraint forbids), even none.
        if self._cache is None or self._proposed == 0:
            return
        # The cache holds the committed prefix plus drafts 1..proposed-1; keep only the drafts
        # the target accepted (the bonus token and any unseen tokens are fed next time).
        keep = self._proposal_base + min(feedback.accepted, self._proposed - 1)
        rewind(self._cache, min(keep, cache_length(self._cache)))
        self._proposed = 0

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "kind": "model",
            "layers": self.model.config.num_hidden_layers,
            "confidence_threshold": self.confidence_threshold,
        }


def check_same_tokenizer(path: str, target_tokenizer: PreTrainedTokenizerBase) -> None:
    """Refuse the draft at ``path`` when the tokenizer it ships differs from the target's."""
    from transformers import AutoTokenizer

    try:
        draft_tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        return  # no tokenizer shipped with the draft: the vocabulary-size check still runs
    if draft_tokenizer.get_vocab() != target_tokenizer.get_vocab():
        raise IncompatibleDraftError(
            f"the draft at {path!r} uses a different tokenizer from the target's; a draft "
            "must share the target's tokenizer token for token"
        )


def load_model_drafter(path: str, target: LoadedTarget, *, name: str) -> ModelDrafter:
    """The ``model:PATH`` drafter: the causal LM at ``path``, on its target's device, in its
    target's dtype and with its target's kernels."""
    from transformers import AutoModelForCausalLM

    if target.tokenizer is not None:
        check_same_tokenizer(path, target.tokenizer)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=target.dtype).eval()
    return model_drafter_for(model, target, name=name)


def model_drafter_for(model: PreTrainedModel, target: LoadedTarget, *, name: str) -> ModelDrafter:
    """A drafter of the causal LM ``model`` (in its target's dtype) served like ``target``:
    on its device and with its kernels (quantised as it is quantised)."""
    if target.device.type != "cpu":
        cast(torch.nn.Module, model).to(target.device)  # in place: every parameter moves
    apply_kernels(model, target.kernels, exact=False)  # its target's kernels
    drafter = ModelDrafter(target.over(model.eval(), lean=False), name=name)
    drafter.check_compatible(target.vocab_size)
    return drafter
