"""A head scored on a teacher cache of held-out prompts: its top-1 agreement with the
target's greedy answers and the mean accepted length replayed at ``k`` drafts a step
(:mod:`tasks.evaluate.offline_acceptance`, which walks the answers as the engine does).

On a target on the lean step the drafts come from the path that serves: the head's lean
step (:class:`serving.lean.head_step.LeanHeadStep`, on the target's kernels), fed the
cache's features pair by pair as the head drafter is fed them, ``k`` chained drafts at every
answer position (:func:`served_hits`). Elsewhere they come from the head's float forward
over the whole sequence (:func:`~tasks.evaluate.offline_acceptance.head_hits`, the
training's own unroll). The cache must be of the target the head is for; the score names
the hardware target whose lean step computed its features (``specops teacher build
--hardware``), so that a head is judged on the features it will be served.
"""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict

from serving.engine.drafters.head import head_step_for
from serving.errors import BadInputError
from serving.lean.head_step import LeanHeadStep
from serving.models.head import CONFIG_FILE, load_head
from serving.target import LoadedTarget
from tasks.evaluate.offline_acceptance import head_hits, replay_all
from tasks.train.head_loss import frozen_target
from tasks.train.teacher import TeacherSequence, load_teacher_data
from tasks.train.train_head import check_target


class HeadScore(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    head: str
    teacher: str
    features_from: str  # the hardware target whose lean step computed them, or "transformers"
    drafted_by: str  # "lean head step on <hardware>" or "float head"
    sequences: int
    positions: int  # answer positions scored for agreement
    k: int
    agreement: float | None  # the first draft's top-1 agreement
    mean_accepted_length: float | None  # tokens per target step, replayed at k


def head_folder(path: Path) -> Path:
    """``path`` itself if it is a head folder, or a head draft package's ``head/``."""
    for candidate in (path, path / "head"):
        if (candidate / CONFIG_FILE).is_file():
            return candidate
    raise BadInputError(f"{path} is neither a draft-head folder nor a head draft package")


@torch.inference_mode()
def served_hits(step: LeanHeadStep, sequence: TeacherSequence, k: int) -> list[list[bool]]:
    """``k`` rows of hits (as :func:`~tasks.evaluate.offline_acceptance.replay` reads them)
    of the lean head step's chained greedy drafts at every answer position of ``sequence``,
    fed as the head drafter is: the prompt's pairs at once, then one true pair a step."""
    tokens, features = sequence.tokens, sequence.features.float()
    length, first = int(tokens.shape[0]), sequence.prompt_len - 1
    hits = [[False] * length for _ in range(k)]
    if first < 1:
        return hits
    cache = step.new_cache()
    tail = step.feed(features[:first], tokens[1 : first + 1], cache)[-1]  # f̂ of x_first
    truth = tokens.tolist()
    for t in range(first, length - 1):  # the step whose last known token is x_t
        feature = tail
        for depth in range(min(k, length - 1 - t)):
            token = step.to_full(step.logits(feature[None])[0].argmax())
            hits[depth][t] = int(token) == truth[t + depth + 1]
            if not hits[depth][t] or depth == k - 1:
                break  # the replay reads no later draft of this step
            feature = step.feed(feature[None], token.view(1), cache)[0]
        cache.length = t  # the speculative entries go; the true pair t comes next
        tail = step.feed(features[t : t + 1], tokens[t + 1 : t + 2], cache)[0]
    return hits


def score_head(head_path: Path, teacher: Path, target: LoadedTarget, *, k: int) -> HeadScore:
    """The head at ``head_path`` (a folder or a package) scored on the teacher cache
    ``teacher`` of ``target``'s model, ``k`` drafts a step (see the module doc)."""
    if not 1 <= k <= 8:
        raise BadInputError(f"k must be in [1, 8], got {k}")
    folder = head_folder(head_path)
    manifest, sequences = load_teacher_data(teacher)
    check_target(manifest.target, target.model)
    head = load_head(folder, target.model)
    step = head_step_for(head, target)
    if isinstance(step, LeanHeadStep):
        lean_step = step
        total = replay_all(lambda s: served_hits(lean_step, s, k), sequences, k)
        drafted_by = f"lean head step on {target.hardware.name}"
    else:
        frozen = frozen_target(target.model, head.vocab_ids)
        total = replay_all(lambda s: head_hits(head, s, frozen, depths=k), sequences, k)
        drafted_by = "float head"
    return HeadScore(
        head=str(head_path),
        teacher=str(teacher),
        features_from=str(manifest.target.get("hardware", "transformers")),
        drafted_by=drafted_by,
        sequences=len(sequences),
        positions=total.scored,
        k=k,
        agreement=total.agreement,
        mean_accepted_length=total.mean_accepted_length,
    )
