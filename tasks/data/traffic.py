"""Traffic workloads built from real data shipped in installed packages (nothing is fetched).

Three kinds of traffic (:data:`serving.records.schema.WORKLOADS`), each a list of
:class:`tasks.data.prompts.Prompt` ready for a chat template:

- ``sharegpt`` (:mod:`tasks.data.sharegpt`): first user turns of real ShareGPT
  conversations; the reference is the assistant's reply.
- ``humaneval`` (:mod:`tasks.data.humaneval`): "complete this function" requests for the
  164 HumanEval problems; the reference is the canonical solution.
- ``grounded`` (:mod:`tasks.data.grounded`): edit/rewrite/annotate requests whose answer
  copies large spans of the input.

A user's own traffic is a fourth kind: ``file:PATH`` names a JSONL file of OpenAI-style
chat-completion requests (:mod:`tasks.data.chat_requests`), taken in file order as ``live``
train traffic.

Splits and seeded selection are in :mod:`tasks.data.prompts`. Here: one workload by name
(:func:`build_workload`) and traffic that changes kind (:func:`drift_scenario`).
"""

from __future__ import annotations

from collections.abc import Sequence

from serving.errors import BadInputError
from serving.records.schema import WORKLOADS
from tasks.data.chat_requests import read_chat_requests
from tasks.data.grounded import grounded_prompts
from tasks.data.humaneval import humaneval_prompts
from tasks.data.prompts import Prompt, SplitSelector, check_n
from tasks.data.sharegpt import sharegpt_prompts

# ``file:PATH`` names a user's own traffic: a JSONL file of chat-completion requests.
FILE_WORKLOAD_PREFIX = "file:"


def build_workload(
    name: str, n: int, *, seed: int, split: SplitSelector = "heldout"
) -> list[Prompt]:
    """``n`` prompts of workload ``name`` from ``split``: one of :data:`WORKLOADS` (a seeded
    selection), or ``file:PATH`` (the file's first ``n`` requests, see :func:`file_workload`;
    ``seed`` is not used)."""
    if name.startswith(FILE_WORKLOAD_PREFIX):
        return file_workload(name[len(FILE_WORKLOAD_PREFIX) :], n, split=split)
    builders = {
        "sharegpt": sharegpt_prompts,
        "humaneval": humaneval_prompts,
        "grounded": grounded_prompts,
    }
    if name not in builders:
        raise BadInputError(
            f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}, or "
            f"{FILE_WORKLOAD_PREFIX}PATH for a JSONL file of chat-completion requests"
        )
    return builders[name](n, seed=seed, split=split)


def file_workload(path: str, n: int, *, split: SplitSelector = "train") -> list[Prompt]:
    """The first ``n`` requests of the chat-requests file at ``path``, in file order.

    File order, not a seeded sample: a user's traffic file is usually in the order it was
    served, and the held-out part is its newest share once collected. For the same reason
    it has only the train split: ``split`` must be ``"train"`` or ``"all"``.
    """
    check_n(n)
    if split not in ("train", "all"):
        raise BadInputError(
            f"split {split!r} of workload {FILE_WORKLOAD_PREFIX}{path}: a file of requests is "
            "all train traffic, and its held-out part is chosen by time once collected (the "
            "newest dataset.heldout_share of it); ask for split 'train' or 'all'"
        )
    if not path:
        raise BadInputError(
            f"workload {FILE_WORKLOAD_PREFIX!r} names no file; write {FILE_WORKLOAD_PREFIX}PATH"
        )
    prompts = read_chat_requests(path)
    if n > len(prompts):
        raise BadInputError(
            f"asked for n={n} requests but {path!r} has only {len(prompts)}; ask for fewer"
        )
    return prompts[:n]


def drift_scenario(
    n_per_phase: int,
    *,
    seed: int,
    phases: Sequence[str] = ("sharegpt", "humaneval"),
    split: SplitSelector = "heldout",
) -> list[tuple[int, Prompt]]:
    """Traffic that changes kind: ``n_per_phase`` prompts of each phase's workload in turn.

    Returns ``(phase_index, prompt)`` pairs in serving order. A workload that appears in
    several phases gets fresh prompts each time (no prompt repeats across phases).
    """
    if isinstance(phases, str) or not phases:
        raise BadInputError(
            f"phases must be a non-empty sequence of workload names, got {phases!r}"
        )
    check_n(n_per_phase)
    counts = {name: list(phases).count(name) for name in phases}
    pools = {
        name: build_workload(name, n_per_phase * count, seed=seed, split=split)
        for name, count in counts.items()
    }
    used = dict.fromkeys(counts, 0)
    scenario: list[tuple[int, Prompt]] = []
    for index, name in enumerate(phases):
        start = used[name] * n_per_phase
        scenario.extend((index, p) for p in pools[name][start : start + n_per_phase])
        used[name] += 1
    return scenario
