"""Teacher-forced records from the lean step: the features a head trains on, as the serving
target computes them (``specops teacher build --hardware``).

One packed pass over several whole sequences (each with its own cache, no padding) gives
every position's final hidden state (``want_hidden``); the target's own output layer then
gives the top-k next-token log-probabilities, a chunk of positions at a time. The lean step
computes a row the same whatever rows share its pass, so a sequence's features here equal,
bit for bit, what the head drafter receives while that sequence is served (tested).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from serving.target import LoadedTarget

LOGIT_CHUNK = 256  # positions per output-layer chunk when taking top-k (bounds memory)
Record = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@torch.inference_mode()
def lean_teacher_forced(
    target: LoadedTarget, sequences: Sequence[list[int]], *, top_k: int
) -> list[Record]:
    """Per sequence ``(features [seq, hidden], top_ids [seq, top_k], top_logprobs [seq,
    top_k])``, from one packed pass of ``target``'s step (see the module doc)."""
    step = target.step
    assert step is not None, "lean_teacher_forced needs a target on the lean step"
    rows = [len(s) for s in sequences]
    caches = [step.new_cache() for _ in sequences]
    ids = torch.tensor([t for s in sequences for t in s], dtype=torch.int64)
    hidden = step.forward(ids, caches, rows, keep=1, want_hidden=True).hidden
    assert hidden is not None
    output = target.model.get_output_embeddings()
    top_ids, top_logprobs = [], []
    for start in range(0, hidden.shape[0], LOGIT_CHUNK):
        logits = output(hidden[start : start + LOGIT_CHUNK]).float()  # [chunk, vocab]
        top = logits.log_softmax(dim=-1).topk(top_k, dim=-1)
        top_ids.append(top.indices)
        top_logprobs.append(top.values)
    ids_all, logprobs_all = torch.cat(top_ids), torch.cat(top_logprobs)
    records: list[Record] = []
    start = 0
    for count in rows:
        end = start + count
        records.append((hidden[start:end], ids_all[start:end], logprobs_all[start:end]))
        start = end
    return records
