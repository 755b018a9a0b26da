"""The skeleton-of-thought benchmark on the planning workload (held-out ShareGPT prompts
that ask for steps, plans or lists: tasks/data/planning.py).

Per prompt, in one run and on one target:

- ``skeleton``: skeleton-of-thought with its branches decoded as one batch;
- ``sequential``: the very same requests (skeleton, then each branch) one at a time, each
  with its own pass: the same tokens (checked), so the ratio is what batching buys;
- ``plain``: the question answered directly, as a user would otherwise decode it.

Reported: end-to-end latency ratios, skeleton validity (every skeleton parses: the
constraint makes it so), the share answered ``[DIRECT]``, points per plan, tokens and
characters against the plain answer, and branches that hit their budget.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serving.atomic import write_json_atomic
from serving.curves import BatchLimits, PassCost
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.sampling import SamplingParams
from serving.errors import SpecOpsError
from serving.loader import encode_messages
from serving.skeleton.constraint import SkeletonConstraint
from serving.skeleton.decode import SkeletonAnswer, answer_with_skeleton, skeleton_budget
from serving.skeleton.parse import parse_skeleton
from serving.skeleton.prompts import branch_messages, skeleton_messages
from serving.target import LoadedTarget
from tasks.data.planning import planning_prompts

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def _tokenizer(target: LoadedTarget) -> PreTrainedTokenizerBase:
    if target.tokenizer is None:
        raise SpecOpsError(f"target {target.source!r} was loaded without a tokenizer")
    return target.tokenizer


def skeleton_constraint(target: LoadedTarget) -> SkeletonConstraint:
    """The skeleton grammar over the target's vocabulary, ended by the target's EOS ids."""
    return SkeletonConstraint(
        _tokenizer(target), vocab_size=target.vocab_size, eos_token_ids=target.eos_token_ids
    )


def answer_question(
    target: LoadedTarget,
    new_decoder: Callable[[], SpeculativeDecoder],
    question: str,
    *,
    max_tokens: int,
    sampling: SamplingParams,
) -> SkeletonAnswer:
    """One question answered skeleton-of-thought by ``target`` (with its hardware target's
    batch limits and pass cost): ``specops generate --skeleton``."""
    return answer_with_skeleton(
        new_decoder,
        _tokenizer(target),
        question,
        skeleton_constraint(target),
        max_tokens=max_tokens,
        sampling=sampling,
        limits=target.hardware.batch_limits(),
        cost=target.hardware.pass_cost(),
    )


def answer_summary(answer: SkeletonAnswer) -> dict[str, Any]:
    """An answer as ``specops generate --skeleton --json`` prints it."""
    return {
        "text": answer.text,
        "skeleton": answer.skeleton_text,
        "direct": answer.skeleton.direct,
        "branches": [vars(b) for b in answer.branches],
        "truncated": answer.truncated,
        "completion_tokens": answer.completion_tokens,
        "skeleton_s": round(answer.skeleton_s, 3),
        "answer_s": round(answer.answer_s, 3),
    }


def truncated_points(answer: SkeletonAnswer) -> list[int]:
    """The points (1-based) whose branch hit its token budget."""
    return [i + 1 for i, branch in enumerate(answer.branches) if branch.truncated]


def _sequential(
    new_decoder: Callable[[], SpeculativeDecoder],
    tokenizer: PreTrainedTokenizerBase,
    question: str,
    constraint: SkeletonConstraint,
    max_tokens: int,
) -> tuple[float, list[list[int]]]:
    """The skeleton and each branch decoded alone, one after the other."""
    started = time.perf_counter()
    plan_ids = encode_messages(tokenizer, skeleton_messages(question, constraint.fmt))
    plan = new_decoder().stream(
        plan_ids, max_new_tokens=skeleton_budget(constraint), constraint=constraint
    )
    tokens = [plan.run().token_ids]
    skeleton = parse_skeleton(str(tokenizer.decode(tokens[0], skip_special_tokens=True)))
    if skeleton.direct:
        ids = encode_messages(tokenizer, [{"role": "user", "content": question}])
        tokens.append(new_decoder().generate(ids, max_new_tokens=max_tokens).token_ids)
    else:
        for i in range(len(skeleton.points)):
            ids = encode_messages(tokenizer, branch_messages(question, skeleton, i))
            tokens.append(new_decoder().generate(ids, max_new_tokens=max_tokens).token_ids)
    return time.perf_counter() - started, tokens


def run_skeleton_bench(
    target: LoadedTarget,
    new_decoder: Callable[[], SpeculativeDecoder],
    constraint: SkeletonConstraint,
    *,
    prompts: int,
    max_tokens: int,
    plain_max_tokens: int,
    limits: BatchLimits,
    cost: PassCost,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Every planning prompt answered skeleton-of-thought, the same requests one at a time,
    and plainly, by ``target`` (see the module docstring)."""
    from tqdm.auto import tqdm

    tokenizer = _tokenizer(target)
    rows = []
    for prompt in tqdm(planning_prompts(prompts, seed=seed), disable=not progress, desc="sot"):
        question = prompt.messages[-1]["content"]
        answer = answer_with_skeleton(
            new_decoder,
            tokenizer,
            question,
            constraint,
            max_tokens=max_tokens,
            sampling=SamplingParams(),
            limits=limits,
            cost=cost,
        )
        sequential_s, sequential_tokens = _sequential(
            new_decoder, tokenizer, question, constraint, max_tokens
        )
        started = time.perf_counter()
        ids = encode_messages(tokenizer, [{"role": "user", "content": question}])
        plain = new_decoder().generate(ids, max_new_tokens=plain_max_tokens)
        plain_s = time.perf_counter() - started
        plain_text = tokenizer.decode(plain.token_ids, skip_special_tokens=True)
        rows.append(
            {
                "id": prompt.id,
                "question": question,
                "skeleton": answer.skeleton_text,
                "direct": answer.skeleton.direct,
                "points": len(answer.skeleton.points),
                "skeleton_s": answer.skeleton_s,
                "total_s": answer.total_s,
                "sequential_s": sequential_s,
                "same_tokens_as_sequential": [r.token_ids for r in answer.results]
                == sequential_tokens,
                "plain_s": plain_s,
                "tokens": answer.completion_tokens,
                "plain_tokens": len(plain.token_ids),
                "chars": len(answer.text),
                "plain_chars": len(plain_text),
                "truncated_branches": sum(b.truncated for b in answer.branches),
                "plain_truncated": plain.stop_reason == "length",
                "text": answer.text,
                "plain_text": plain_text,
            }
        )
    return {"summary": summarise(rows), "prompts": rows}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def ratio(a: str, b: str) -> float:
        return sum(r[a] for r in rows) / sum(r[b] for r in rows)

    return {
        "prompts": len(rows),
        "skeleton_valid": 1.0,  # every skeleton above parsed (parse_skeleton raises otherwise)
        "direct_share": sum(r["direct"] for r in rows) / len(rows),
        "mean_points": statistics.fmean(r["points"] for r in rows if not r["direct"])
        if any(not r["direct"] for r in rows)
        else 0.0,
        "batched_vs_sequential_latency": ratio("total_s", "sequential_s"),
        "skeleton_vs_plain_latency": ratio("total_s", "plain_s"),
        "same_tokens_as_sequential": all(r["same_tokens_as_sequential"] for r in rows),
        "tokens_vs_plain": ratio("tokens", "plain_tokens"),
        "chars_vs_plain": ratio("chars", "plain_chars"),
        "skeleton_share_of_latency": ratio("skeleton_s", "total_s"),
        "truncated_branches": sum(r["truncated_branches"] for r in rows),
        "branches": sum(r["points"] for r in rows if not r["direct"]),
        "plain_truncated": sum(r["plain_truncated"] for r in rows),
        "tokens_per_s": sum(r["tokens"] for r in rows) / sum(r["total_s"] for r in rows),
        "plain_tokens_per_s": sum(r["plain_tokens"] for r in rows)
        / sum(r["plain_s"] for r in rows),
    }


def write_results(results: dict[str, Any], out: Path) -> None:
    write_json_atomic(out, results)
