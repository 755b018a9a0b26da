"""Building teacher caches: the target's own greedy answers, replayed with one forward pass.

For each prompt the target first answers greedily (batched, left-padded ``generate``;
:mod:`tasks.train.teacher_answers`), or a given answer is used; then one teacher-forced pass
over ``prompt + answer`` (batched, right-padded, with an attention mask) records what
:mod:`tasks.train.teacher` describes and reads back. Given a :class:`LoadedTarget` on the
lean step, both run there instead (packed batches, :mod:`tasks.train.lean_answers` and
:mod:`tasks.train.lean_features`): the answers and features are the ones it serves, and
the manifest records its hardware target.

Prompts are cut into shards of ``shard_size``; each shard is one safetensors file written
atomically (temporary file + ``os.replace``) and listed in the manifest (rewritten atomically
after every shard). A re-run skips shards already written for the same prompts, so an
interrupted run resumes; a cache built for another target or other settings is refused
rather than mixed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from serving.atomic import atomic_path, write_text_atomic
from serving.errors import BadInputError
from tasks.train.teacher import (
    MANIFEST,
    TEACHER_FORMAT,
    ShardEntry,
    TeacherConfig,
    TeacherManifest,
    read_manifest,
    target_fingerprint,
)
from tasks.train.teacher_answers import greedy_answers

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from serving.target import LoadedTarget

_LOGIT_CHUNK = 256  # positions per output-layer chunk when taking top-k (bounds memory)


@dataclass(frozen=True)
class TeacherPrompt:
    id: str
    token_ids: list[int]  # the chat-templated prompt, ready for the target


@dataclass(frozen=True)
class TeacherReport:
    cache_dir: Path
    sequences: int
    tokens: int
    shards_written: int
    shards_skipped: int
    generated_tokens: int  # answer tokens generated in this run
    generate_tokens_per_s: float | None  # over this run's generation (None: nothing ran)
    forward_tokens_per_s: float | None  # over this run's teacher-forced passes


# ------------------------------------------------------------------------------ prompts


def encode_traffic(
    tokenizer, prompts: Sequence, *, max_prompt_tokens: int | None = None
) -> list[TeacherPrompt]:
    """Chat-template :class:`tasks.data.prompts.Prompt` s; drop those longer than
    ``max_prompt_tokens``."""
    from serving.loader import encode_messages

    encoded = []
    for prompt in prompts:
        ids = encode_messages(tokenizer, prompt.messages)
        if max_prompt_tokens is None or len(ids) <= max_prompt_tokens:
            encoded.append(TeacherPrompt(prompt.id, ids))
    return encoded


def sharegpt_teacher_prompts(
    tokenizer, n: int, *, seed: int = 0, max_prompt_tokens: int = 512
) -> list[TeacherPrompt]:
    """``n`` real ShareGPT first turns from the **train** split, chat-templated, each at most
    ``max_prompt_tokens`` tokens (longer ones are skipped; candidates are drawn in the
    seeded order of :func:`tasks.data.sharegpt.sharegpt_prompts`)."""
    from tasks.data.sharegpt import sharegpt_prompts

    if n < 1:
        raise BadInputError(f"n must be >= 1, got {n!r}")
    # Rarely does a token hold more than ~4 characters: longer texts would not fit anyway.
    candidates = sharegpt_prompts(
        2 * n + 16, seed=seed, split="train", max_prompt_chars=4 * max_prompt_tokens
    )
    picked = encode_traffic(tokenizer, candidates, max_prompt_tokens=max_prompt_tokens)[:n]
    if len(picked) < n:
        raise BadInputError(
            f"only {len(picked)} of the {len(candidates)} ShareGPT candidates fit "
            f"max_prompt_tokens={max_prompt_tokens}; raise it or ask for fewer prompts"
        )
    return picked


# -------------------------------------------------------------------------- target side


@torch.inference_mode()
def teacher_forced(
    target: PreTrainedModel, sequences: Sequence[list[int]], *, top_k: int, pad_token_id: int
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """One right-padded pass over ``sequences``: per sequence ``(features [seq, hidden],
    top_ids [seq, top_k], top_logprobs [seq, top_k])``."""
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.int64)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.int64)
    for row, sequence in enumerate(sequences):
        input_ids[row, : len(sequence)] = torch.tensor(sequence)
        attention_mask[row, : len(sequence)] = 1
    device = next(target.parameters()).device
    out = target(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        output_hidden_states=True,
        logits_to_keep=1,  # the full logits are taken below in chunks, not all at once
    )
    hidden = out.hidden_states[-1]  # [batch, width, hidden], post-final-norm
    head = target.get_output_embeddings()
    results = []
    for row, sequence in enumerate(sequences):
        features = hidden[row, : len(sequence)]  # [seq, hidden]
        ids, logprobs = [], []
        for start in range(0, len(sequence), _LOGIT_CHUNK):
            logits = head(features[start : start + _LOGIT_CHUNK]).float()  # [chunk, vocab]
            top = logits.log_softmax(dim=-1).topk(top_k, dim=-1)
            ids.append(top.indices)
            logprobs.append(top.values)
        results.append((features.cpu(), torch.cat(ids).cpu(), torch.cat(logprobs).cpu()))
    return results


def _token_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Indices grouped by length (longest first) so each padded batch fits the budget."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for index in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= batch_tokens:
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches


# ------------------------------------------------------------------------------- shards


def _shard_file(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def _write_shard(path: Path, tensors: dict[str, torch.Tensor], prompt_ids: list[str]) -> None:
    from safetensors.torch import save_file

    metadata = {"format": str(TEACHER_FORMAT), "prompt_ids": json.dumps(prompt_ids)}
    with atomic_path(path) as scratch:  # readers see no shard or a complete one
        save_file(tensors, str(scratch), metadata=metadata)


def _shard_prompt_ids(path: Path) -> list[str] | None:
    """The prompt ids recorded in a complete shard file, or None if absent/unreadable."""
    from safetensors import safe_open

    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        return list(json.loads(metadata["prompt_ids"]))
    except Exception:  # a corrupt shard is rebuilt, never trusted
        return None


def _check_prompts(prompts: Sequence[TeacherPrompt]) -> None:
    if not prompts:
        raise BadInputError("no prompts to build teacher data from; give at least one")
    empty = [p.id for p in prompts if not p.token_ids]
    if empty:
        raise BadInputError(f"prompts {empty[:3]} have no tokens")
    if len({p.id for p in prompts}) != len(prompts):
        raise BadInputError("prompt ids repeat; each teacher prompt needs a unique id")


def _new_manifest(
    cache_dir: Path,
    target: PreTrainedModel,
    config: TeacherConfig,
    eos: list[int],
    mask_token_id: int | None,
    hardware: str | None = None,
) -> TeacherManifest:
    """The manifest of the data to build in ``cache_dir`` (its shards not yet listed),
    refused when the folder holds data of another target or other settings. ``hardware``:
    the hardware target whose lean step computed it (recorded in the fingerprint)."""
    fingerprint = target_fingerprint(target)
    if hardware is not None:
        fingerprint = {**fingerprint, "hardware": hardware, "step": "lean"}
    existing = read_manifest(cache_dir)
    if existing is not None and (
        existing.target != fingerprint
        or existing.config != config
        or existing.eos_token_ids != eos
        or existing.mask_token_id != mask_token_id
    ):
        raise BadInputError(
            f"{cache_dir} holds teacher data of another target or other settings "
            f"({existing.target}, {existing.config}); use a new folder"
        )
    return TeacherManifest(
        target=fingerprint, eos_token_ids=eos, config=config, mask_token_id=mask_token_id
    )


def _greedy(
    target: PreTrainedModel | LoadedTarget,
    shard: Sequence[TeacherPrompt],
    config: TeacherConfig,
    *,
    eos: list[int],
    pad: int,
) -> list[list[int]]:
    """The target's greedy answer to each prompt of ``shard``, in generation batches (a
    lean target's packed batches)."""
    if not isinstance(target, torch.nn.Module):  # a LoadedTarget on the lean step
        import dataclasses

        from serving.curves import BatchLimits
        from tasks.train.lean_answers import lean_answers

        size = config.generation_batch_size
        return lean_answers(
            dataclasses.replace(target, eos_token_ids=tuple(eos)),
            [p.token_ids for p in shard],
            max_new_tokens=config.max_new_tokens,
            limits=BatchLimits(max_sequences=size, max_tokens_per_pass=max(512, 16 * size)),
        )
    answers: list[list[int]] = []
    for start in range(0, len(shard), config.generation_batch_size):
        batch = shard[start : start + config.generation_batch_size]
        answers += greedy_answers(
            target,
            [p.token_ids for p in batch],
            max_new_tokens=config.max_new_tokens,
            eos_token_ids=eos,
            pad_token_id=pad,
        )
    return answers


def _teacher_records(
    target: PreTrainedModel | LoadedTarget,
    sequences: Sequence[list[int]],
    config: TeacherConfig,
    *,
    pad: int,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Each sequence's teacher-forced record (:func:`teacher_forced`, or a lean target's
    :func:`~tasks.train.lean_features.lean_teacher_forced`), in order, the sequences passed
    in batches of about ``config.batch_tokens`` tokens."""
    from tasks.train.lean_features import lean_teacher_forced

    records: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]
    records = [None] * len(sequences)
    for batch_indices in _token_batches([len(s) for s in sequences], config.batch_tokens):
        batch = [sequences[i] for i in batch_indices]
        if isinstance(target, torch.nn.Module):
            outputs = teacher_forced(target, batch, top_k=config.top_k, pad_token_id=pad)
        else:
            outputs = lean_teacher_forced(target, batch, top_k=config.top_k)
        for i, record in zip(batch_indices, outputs, strict=True):
            records[i] = record
    done = [r for r in records if r is not None]
    assert len(done) == len(sequences)
    return done


def _shard_tensors(
    shard: Sequence[TeacherPrompt],
    sequences: Sequence[list[int]],
    records: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """A shard's tensors: its sequences' tokens, their records (features in ``dtype``) and
    where each sequence and its prompt end."""
    lengths = torch.tensor([0] + [len(s) for s in sequences])
    return {
        "tokens": torch.tensor([t for s in sequences for t in s], dtype=torch.int64),
        "features": torch.cat([r[0] for r in records]).to(dtype).contiguous(),
        "top_ids": torch.cat([r[1] for r in records]).to(torch.int32).contiguous(),
        "top_logprobs": torch.cat([r[2] for r in records]).contiguous(),
        "offsets": lengths.cumsum(0),
        "prompt_lens": torch.tensor([len(p.token_ids) for p in shard]),
    }


def build_teacher_cache(
    target: PreTrainedModel | LoadedTarget,
    prompts: Sequence[TeacherPrompt],
    cache_dir: str | Path,
    *,
    eos_token_ids: Sequence[int],
    pad_token_id: int | None = None,
    config: TeacherConfig | None = None,
    answers: Mapping[str, Sequence[int]] | None = None,
    mask_token_id: int | None = None,
    progress: bool = True,
) -> TeacherReport:
    """Generate and record teacher data for ``prompts`` under ``cache_dir`` (resumable): by
    ``target``'s lean step where it is a :class:`LoadedTarget` on one, otherwise by
    transformers' forward of the model.

    With ``answers`` (prompt id -> the target's greedy answer, e.g. from
    :mod:`tasks.train.teacher_answers` run on a GPU), nothing is generated: each prompt's given
    answer is teacher-forced instead. ``mask_token_id`` (redaction's mask token, for
    answers from captured traffic) is kept in the manifest: the trainers leave the positions
    that read or predict it out of their losses (:mod:`tasks.train.masked_labels`).
    """
    from tqdm.auto import tqdm

    from serving.lean.step import LeanStep

    config = config or TeacherConfig()
    model = target if isinstance(target, torch.nn.Module) else target.model
    lean = None if isinstance(target, torch.nn.Module) else target
    if lean is not None and not isinstance(lean.step, LeanStep):
        lean = None  # a LoadedTarget off the lean step: transformers' forward of its model
    runner: PreTrainedModel | LoadedTarget = model if lean is None else lean
    _check_prompts(prompts)
    if answers is not None:
        _check_answers(prompts, answers, config, int(model.config.vocab_size))
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    eos = sorted({int(t) for t in eos_token_ids})
    pad = int(pad_token_id if pad_token_id is not None else (model.config.pad_token_id or 0))
    hardware = None if lean is None else lean.hardware.name
    manifest = _new_manifest(cache_dir, model, config, eos, mask_token_id, hardware)
    dtype = getattr(torch, config.feature_dtype)
    shards = [prompts[i : i + config.shard_size] for i in range(0, len(prompts), config.shard_size)]
    written = skipped = generated = forwarded = 0
    generate_s = forward_s = 0.0
    bar = tqdm(total=len(prompts), desc="teacher data", unit="prompt", disable=not progress)
    for index, shard in enumerate(shards):
        ids = [p.id for p in shard]
        path = cache_dir / _shard_file(index)
        if _shard_prompt_ids(path) == ids:
            skipped += 1
        else:
            started = time.perf_counter()
            shard_answers: list[list[int]] = []
            if answers is not None:
                shard_answers = [list(answers[p.id]) for p in shard]
            else:
                shard_answers = _greedy(runner, shard, config, eos=eos, pad=pad)
                generate_s += time.perf_counter() - started
                generated += sum(map(len, shard_answers))
            sequences = [p.token_ids + a for p, a in zip(shard, shard_answers, strict=True)]
            started = time.perf_counter()
            done = _teacher_records(runner, sequences, config, pad=pad)
            forward_s += time.perf_counter() - started
            forwarded += sum(map(len, sequences))
            _write_shard(path, _shard_tensors(shard, sequences, done, dtype), ids)
            written += 1
        tokens = _shard_tokens(path)
        manifest.shards.append(
            ShardEntry(file=path.name, prompt_ids=ids, sequences=len(shard), tokens=tokens)
        )
        write_text_atomic(cache_dir / MANIFEST, manifest.model_dump_json(indent=2))
        bar.update(len(shard))
        if forward_s:
            bar.set_postfix(
                gen_tok_s=f"{generated / max(generate_s, 1e-9):.0f}",
                fwd_tok_s=f"{forwarded / forward_s:.0f}",
            )
    bar.close()
    return TeacherReport(
        cache_dir=cache_dir,
        sequences=len(prompts),
        tokens=manifest.tokens,
        shards_written=written,
        shards_skipped=skipped,
        generated_tokens=generated,
        generate_tokens_per_s=generated / generate_s if generate_s else None,
        forward_tokens_per_s=forwarded / forward_s if forward_s else None,
    )


def _check_answers(
    prompts: Sequence[TeacherPrompt],
    answers: Mapping[str, Sequence[int]],
    config: TeacherConfig,
    vocab_size: int,
) -> None:
    """Every prompt has an answer of at most ``max_new_tokens`` in-vocabulary ids."""
    missing = [p.id for p in prompts if p.id not in answers]
    if missing:
        raise BadInputError(
            f"{len(missing)} prompts have no given answer (e.g. {missing[:3]}); answer them "
            "all (python -m tasks.train.teacher_answers) or drop the answers to generate here"
        )
    for prompt in prompts:
        answer = answers[prompt.id]
        if len(answer) > config.max_new_tokens:
            raise BadInputError(
                f"the answer to {prompt.id!r} has {len(answer)} tokens, more than "
                f"max_new_tokens={config.max_new_tokens}; answer with the same max_new_tokens"
            )
        bad = [t for t in answer if not 0 <= int(t) < vocab_size]
        if bad:
            raise BadInputError(
                f"the answer to {prompt.id!r} holds token ids outside the target's vocabulary "
                f"[0, {vocab_size}): {bad[:3]}; it was made with another tokenizer"
            )


def _shard_tokens(path: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return int(handle.get_slice("tokens").get_shape()[0])
