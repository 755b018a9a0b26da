"""Teacher caches, the reading side: their schema, the target fingerprint, loading.

A teacher cache holds the target's own greedy answers, replayed (built by
:mod:`tasks.train.teacher_build`). For each sequence ``prompt + answer`` it records at every
position ``i``:

- ``features[i]``: the target's post-final-norm hidden state ``f_i`` (what serving's
  ``out.hidden_states[-1]`` gives the head drafter), stored as ``feature_dtype``;
- ``top_ids[i]`` / ``top_logprobs[i]``: the target's ``top_k`` next-token log-probabilities
  (``top_ids[i, 0]`` is its greedy choice for ``x_{i+1}``).

Sequences are stored in safetensors shards listed in ``manifest.json``
(:class:`TeacherManifest`), which also records the target's fingerprint and the settings,
so that data of two targets or two settings is never mixed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serving.errors import BadInputError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

TEACHER_FORMAT = 1
MANIFEST = "manifest.json"


class TeacherConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: int = Field(default=64, ge=1)  # length of each greedy answer (or EOS)
    top_k: int = Field(default=8, ge=1)  # next-token log-probs kept per position
    shard_size: int = Field(default=16, ge=1)  # prompts per shard file
    generation_batch_size: int = Field(default=8, ge=1)
    batch_tokens: int = Field(default=2048, ge=1)  # padded tokens per teacher-forced pass
    feature_dtype: Literal["float16", "bfloat16", "float32"] = "float16"


class ShardEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file: str
    prompt_ids: list[str]
    sequences: int
    tokens: int


class TeacherManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: int = TEACHER_FORMAT
    target: dict[str, object]  # see target_fingerprint
    eos_token_ids: list[int]
    config: TeacherConfig
    # The token redaction put in place of a secret's tokens (serving.security.redact); the
    # trainers leave the positions that read or predict it out of every loss. None: none.
    mask_token_id: int | None = None
    shards: list[ShardEntry] = Field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(shard.tokens for shard in self.shards)


@dataclass(frozen=True)
class TeacherSequence:
    prompt_id: str
    tokens: torch.Tensor  # [seq] int64, prompt then answer
    features: torch.Tensor  # [seq, hidden] float32, f_i
    top_ids: torch.Tensor  # [seq, top_k] int64, the target's top next tokens after x_i
    top_logprobs: torch.Tensor  # [seq, top_k] float32
    prompt_len: int
    mask_token_id: int | None = None  # redaction's mask token (the manifest's), see masked_labels


# -------------------------------------------------------------------------- target side


def target_fingerprint(target: PreTrainedModel) -> dict[str, object]:
    """Shapes plus a digest of a few weights: enough to refuse mixing two targets' data."""
    config = target.config
    embed = target.get_input_embeddings().weight.detach()  # type: ignore[operator]
    digest = hashlib.sha256(embed[:4].float().cpu().numpy().tobytes()).hexdigest()[:16]
    return {
        "name": str(getattr(config, "_name_or_path", "") or config.model_type),
        "hidden_size": int(config.hidden_size),
        "vocab_size": int(config.vocab_size),
        "num_hidden_layers": int(config.num_hidden_layers),
        "embedding_digest": digest,
    }


# ------------------------------------------------------------------------------ reading


def read_manifest(cache_dir: Path) -> TeacherManifest | None:
    """``cache_dir``'s manifest, or None if it has none yet (a corrupt one is an error)."""
    path = cache_dir / MANIFEST
    if not path.is_file():
        return None
    try:
        return TeacherManifest.model_validate(json.loads(path.read_text()))
    except (json.JSONDecodeError, ValidationError) as exc:
        raise BadInputError(
            f"{path} is corrupt ({exc}); delete the folder {cache_dir} and build it again"
        ) from exc


def load_teacher_data(cache_dir: str | Path) -> tuple[TeacherManifest, list[TeacherSequence]]:
    """Every sequence listed in ``cache_dir``'s manifest, features as float32."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    cache_dir = Path(cache_dir)
    manifest = read_manifest(cache_dir) if cache_dir.is_dir() else None
    if manifest is None:
        raise BadInputError(
            f"no teacher cache at {cache_dir} ({MANIFEST} is missing); build it first with "
            "tasks.train.teacher_build.build_teacher_cache"
        )
    sequences: list[TeacherSequence] = []
    for shard in manifest.shards:
        path = cache_dir / shard.file
        try:
            tensors = load_file(str(path))
            offsets = tensors["offsets"].tolist()
            prompt_lens = tensors["prompt_lens"].tolist()
            tokens, features = tensors["tokens"], tensors["features"].float()
            top_ids, top_logprobs = tensors["top_ids"].long(), tensors["top_logprobs"].float()
        except (SafetensorError, OSError, KeyError) as exc:
            raise BadInputError(
                f"teacher shard {path} is missing or corrupt ({exc}); delete it and run "
                "build_teacher_cache again to rebuild it"
            ) from exc
        if len(offsets) != len(shard.prompt_ids) + 1:
            raise BadInputError(f"teacher shard {path} does not match {MANIFEST}; rebuild it")
        for j, prompt_id in enumerate(shard.prompt_ids):
            span = slice(offsets[j], offsets[j + 1])
            sequences.append(
                TeacherSequence(
                    prompt_id=prompt_id,
                    tokens=tokens[span],
                    features=features[span],
                    top_ids=top_ids[span],
                    top_logprobs=top_logprobs[span],
                    prompt_len=int(prompt_lens[j]),
                    mask_token_id=manifest.mask_token_id,
                )
            )
    return manifest, sequences
