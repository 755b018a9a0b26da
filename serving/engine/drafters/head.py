"""The feature-level (EAGLE-style) drafter: a :class:`DraftHead` on the target's hidden states.

The head's KV cache holds one entry per *true pair* ``(f_i, x_{i+1})``: the target's hidden
state at position ``i`` and the token that followed it. With ``n`` committed tokens the
target has seen ``x_0..x_{n-2}``, so pairs ``0..n-2`` are known; the head's output at pair
``n-2`` is ``f̂_{n-1}``, whose logits give the first draft ``d1``. Each later draft feeds the
head its own prediction: ``(f̂_{n-1}, d1)`` at position ``n-1`` gives ``f̂_n`` and ``d2``, etc.

Bookkeeping (``_fed`` true pairs in the cache between calls):

- ``prefill`` (after the engine's prefill pass) feeds the prompt's pairs ``0..n-2``;
- ``propose`` feeds the pairs committed since (``_pending``), then drafts, appending one
  *speculative* entry per draft but the last (the last draft is sampled, never fed);
- ``commit`` rewinds every speculative entry, accepted or not: they were computed from
  predicted features, and the target's true features for the accepted drafts arrive in
  ``StepFeedback.target_hidden`` (``[accepted + 1, hidden]`` for the pending token and the
  accepted drafts). Those pairs line up with ``new_tokens`` and are fed on the next
  ``propose`` (so steps the policy skips cost the head nothing until it drafts again).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import PreTrainedModel

from serving.engine.drafters.base import (
    Drafter,
    DraftProposal,
    DraftRequest,
    StepFeedback,
    draw_draft,
)
from serving.engine.kv import Cache, cache_length, dynamic_cache, rewind
from serving.errors import IncompatibleDraftError, SpecOpsError
from serving.lean.cache import LeanCache
from serving.lean.head_step import LeanHeadStep
from serving.lean.step import LeanStep
from serving.models.head import DraftHead, causal_mask, check_head_fits, output_weight
from serving.models.kernels import apply_kernels
from serving.target import LoadedTarget


class TransformersHead:
    """The head's step through transformers' decoder block (a GPU target, a stock one, or
    any target off the lean step), with the interface of :class:`LeanHeadStep`."""

    def __init__(self, head: DraftHead, target: LoadedTarget) -> None:
        self._embed = target.model.get_input_embeddings()  # frozen, [vocab, hidden]
        # The head runs on its target's device (moved there, in place, like any module) and
        # keeps its own dtype: features and embeddings are cast to it, its predicted
        # features back to the target's dtype for the target's output layer.
        target_weight = next(target.model.parameters())
        self.device: torch.device = target.device
        self._target_dtype = target.dtype
        kernels = target.kernels
        head = head.eval().to(self.device)
        if kernels != "stock":
            head = copy.deepcopy(head)  # packing replaces layers in place; keep the caller's
            apply_kernels(head, kernels, exact=False)  # its target's kernels
        self.head = head
        self._head_dtype = next(head.parameters(), target_weight).dtype
        # [draft_vocab] full-vocabulary ids of the head's logits, or None for all of them.
        self.vocab_ids: torch.Tensor | None = head.vocab_ids
        self._logits_layer = self._output_layer(target.model, kernels)

    def _output_layer(self, target: PreTrainedModel, kernels: str) -> nn.Module:
        if self.vocab_ids is None:
            return target.get_output_embeddings()  # [hidden] -> [vocab]
        rows = output_weight(target).detach()[self.vocab_ids].clone()  # [draft_vocab, hidden]
        layer = nn.Linear(rows.shape[1], rows.shape[0], bias=False)
        layer.weight = nn.Parameter(rows, requires_grad=False)
        holder = nn.ModuleList([layer])
        apply_kernels(holder, kernels)  # the target's own kernels (its rows, same codes)
        return holder[0]

    def new_cache(self) -> Cache:
        return dynamic_cache(self.head.config)

    def feed(self, features: torch.Tensor, tokens: torch.Tensor, cache: Cache) -> torch.Tensor:
        """Append pairs ``(features[j], tokens[j])`` at the cache's next positions.

        ``features`` ``[n, hidden]``, ``tokens`` ``[n]`` -> predicted features ``[n, hidden]``.
        """
        start = cache_length(cache)
        count = int(tokens.shape[0])
        positions = torch.arange(start, start + count, device=self.device)[None]  # [1, n]
        # [1, 1, n, start + n]
        mask = None if count == 1 else causal_mask(count, start, device=self.device)
        embeds = self._embed(tokens)[None].to(self._head_dtype)  # [1, n, hidden]
        out = self.head(features[None].to(self._head_dtype), embeds, positions, mask, cache)
        return out[0]  # [n, hidden]

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """``[n, draft_vocab]`` logits over the head's vocabulary."""
        return self._logits_layer(features.to(self._target_dtype))

    def to_full(self, index: torch.Tensor) -> torch.Tensor:
        return index if self.vocab_ids is None else self.vocab_ids[index]


HeadStep = TransformersHead | LeanHeadStep


def head_step_for(head: DraftHead, target: LoadedTarget) -> HeadStep:
    """The head's step for ``target``: the lean one where the target runs the lean step
    (:mod:`serving.lean.head_step`), transformers' block otherwise."""
    if isinstance(target.step, LeanStep):
        return LeanHeadStep(head, target.model)
    return TransformersHead(head, target)


class HeadDrafter(Drafter):
    kind = "head"
    needs_target_hidden = True
    deterministic = False

    def __init__(self, head: DraftHead, target: LoadedTarget, *, name: str = "head") -> None:
        check_head_fits(head.head_config, target.model)
        self.name = name
        self.head_config = head.head_config
        self.vocab_size = target.vocab_size
        self.device: torch.device = target.device
        self.step: HeadStep = head_step_for(head, target)
        self.vocab_ids: torch.Tensor | None = self.step.vocab_ids
        self._cache: Cache | None = None
        self._fed = 0  # true pairs in the cache (positions 0.._fed-1)
        self._pending: list[torch.Tensor] = []  # [rows, hidden] true features not yet fed
        self._tail: torch.Tensor | None = None  # [hidden] head output at pair _fed - 1
        self._prompt: list[int] = []

    def check_compatible(self, target_vocab_size: int) -> None:
        if self.head_config.target_vocab_size != target_vocab_size:
            raise IncompatibleDraftError(
                f"draft head {self.name!r} was trained for a vocabulary of "
                f"{self.head_config.target_vocab_size} tokens but the target has "
                f"{target_vocab_size}; train a head for this target"
            )

    # ------------------------------------------------------------------------ lifecycle

    def begin(self, prompt: list[int]) -> None:
        self._cache = self.step.new_cache()
        self._fed = 0
        self._pending = []
        self._tail = None
        self._prompt = list(prompt)

    def end(self) -> None:
        self._cache = None
        self._pending = []
        self._tail = None

    @torch.inference_mode()
    def prefill(self, target_hidden: torch.Tensor) -> None:
        """Feed the prompt's pairs: ``target_hidden`` ``[len(prompt) - 1, hidden]``."""
        if self._cache is None:
            raise SpecOpsError("HeadDrafter.prefill() called before begin()")
        expected = len(self._prompt) - 1
        if target_hidden.dim() != 2 or target_hidden.shape[0] != expected:
            raise SpecOpsError(
                f"prefill needs the target's hidden states of the prompt's first {expected} "
                f"tokens, got shape {tuple(target_hidden.shape)}"
            )
        if expected:
            self._pending.append(target_hidden)
            self._feed_pending(self._prompt)

    # -------------------------------------------------------------------------- drafting

    def _feed(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        assert self._cache is not None, "begin() was not called"
        if isinstance(self.step, LeanHeadStep):
            assert isinstance(self._cache, LeanCache)
            return self.step.feed(features, tokens, self._cache)
        return self.step.feed(features, tokens, self._cache)

    def _feed_pending(self, tokens: list[int]) -> None:
        """Feed the true pairs committed since the last feed; ``tokens`` are the request's."""
        if not self._pending:
            return
        features = torch.cat(self._pending)  # [m, hidden]
        count = int(features.shape[0])
        if self._fed + count != len(tokens) - 1:
            raise SpecOpsError(
                f"head drafter out of sync: {self._fed} + {count} pairs for {len(tokens)} tokens"
            )
        pair_tokens = torch.tensor(
            tokens[self._fed + 1 :], dtype=torch.int64, device=self.device
        )  # [m]
        self._tail = self._feed(features, pair_tokens)[-1]  # f̂ of the pending token
        self._fed += count
        self._pending = []

    def _full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """``[draft_vocab]`` -> ``[vocab]`` with -inf outside the reduced vocabulary."""
        if self.vocab_ids is None:
            return logits
        full = logits.new_full((self.vocab_size,), float("-inf"))
        return full.index_copy_(0, self.vocab_ids, logits)

    @torch.inference_mode()
    def propose(self, request: DraftRequest) -> DraftProposal:
        assert self._cache is not None, "begin() was not called"
        self._feed_pending(request.tokens)
        if self._fed != len(request.tokens) - 1:
            raise SpecOpsError(
                f"the head drafter has {self._fed} of the {len(request.tokens) - 1} pairs it "
                "needs: the engine must call prefill() with the prompt's hidden states"
            )
        if self._tail is None or request.k < 1:  # a one-token prompt: no hidden state yet
            return DraftProposal.empty()
        if request.sampler.greedy:
            return self._propose_greedy(self._tail, request.k, request.context is not None)
        feature = self._tail  # [hidden] f̂_{n-1}
        tokens: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        for i in range(request.k):
            logits = self._full_logits(self.step.logits(feature[None])[0])
            token, row = draw_draft(logits, request.sampler)  # row: zero outside the vocabulary
            tokens.append(token)
            probs.append(row)
            if i == request.k - 1:
                break  # the last draft is never fed (commit would rewind it anyway)
            # A speculative entry at position _fed + i: (f̂, draft), dropped in commit().
            feature = self._feed(feature[None], token.view(1))[0]
        return DraftProposal(torch.stack(tokens), draft_probs=torch.stack(probs))

    def _propose_greedy(self, feature: torch.Tensor, k: int, confident: bool) -> DraftProposal:
        """``k`` argmax drafts from ``feature`` (``f̂_{n-1}``): one matmul over the head's
        vocabulary per draft, no softmax over it unless ``confident`` asks for each draft's
        probability (the features the predictor and detailed records read)."""
        if not confident and isinstance(self.step, LeanHeadStep):
            assert self._cache is not None and isinstance(self._cache, LeanCache)
            drafts = self.step.draft_greedy(feature, k, self._cache)
            if drafts is not None:  # one native call for the whole draft
                return DraftProposal(drafts)
        tokens: list[torch.Tensor] = []
        confidence: list[torch.Tensor] = []
        for i in range(k):
            logits = self.step.logits(feature[None])[0]  # [draft_vocab]
            index = logits.argmax()
            if confident:
                confidence.append((logits[index] - logits.float().logsumexp(0)).exp())
            token = self.step.to_full(index)
            tokens.append(token)
            if i == k - 1:
                break
            feature = self._feed(feature[None], token.view(1))[0]
        return DraftProposal(
            torch.stack(tokens), confidence=torch.stack(confidence) if confident else None
        )

    def commit(self, feedback: StepFeedback) -> None:
        if self._cache is None:
            return
        # Every speculative entry goes, accepted or not: the accepted drafts come back as
        # true pairs below (the target's features for them), fed on the next propose().
        rewind(self._cache, self._fed)
        if not feedback.new_tokens:
            return  # the step failed before the target decided anything
        hidden = feedback.target_hidden  # [accepted + 1, hidden]
        if hidden is None or hidden.shape[0] != len(feedback.new_tokens):
            raise SpecOpsError(
                "the head drafter needs the target's hidden state of every committed position; "
                f"got {None if hidden is None else tuple(hidden.shape)} for "
                f"{len(feedback.new_tokens)} new tokens"
            )
        self._pending.append(hidden)

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "kind": "head",
            "draft_vocab": self.head_config.draft_vocab_size or self.vocab_size,
            "intermediate_size": self.head_config.intermediate_size,
        }
