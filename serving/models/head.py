"""An EAGLE-style draft head: one decoder block that predicts the target's next feature.

At position ``i`` the head reads the target's last hidden state ``f_i`` (the post-final-norm
output, ``out.hidden_states[-1]``) and the embedding of the token that followed, ``x_{i+1}``
(the target's frozen ``embed_tokens``), fuses them (``fc``: 2H -> H), runs one Llama
decoder block with its own KV cache and a final RMSNorm, and outputs ``f̂_{i+1}``. The
target's frozen output layer turns ``f̂_{i+1}`` into logits for ``x_{i+2}``, optionally over
a reduced vocabulary (``vocab_ids``: the most frequent tokens of the training traffic).

Only the head's own weights (``fc``, the block, the norm) and ``vocab_ids`` are saved; the
target's embedding and output layer are borrowed at load time. A saved head is a folder:
``head_config.json`` (a :class:`HeadConfig`) and ``head.safetensors``.

Two layouts (:data:`HEAD_LAYOUTS`): ``specops`` (the default: a bias on ``fc``, the block's
input RMSNorm, a final RMSNorm) and ``eagle``, EAGLE-1's own (no ``fc`` bias, no input norm
on the block, no final norm), which is exactly the ``EagleLlamaForCausalLM`` vLLM loads for
its ``eagle`` method, so such a head exports to vLLM weight for weight
(:mod:`tasks.evaluate.eagle_export`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, cast

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from torch import nn
from transformers import DynamicCache, LlamaConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

from serving.atomic import atomic_dir
from serving.errors import IncompatibleDraftError, ModelSourceError

HEAD_FORMAT = 1
CONFIG_FILE = "head_config.json"
WEIGHTS_FILE = "head.safetensors"
HeadLayout = Literal["specops", "eagle"]
HEAD_LAYOUTS: tuple[HeadLayout, ...] = ("specops", "eagle")


class HeadConfig(BaseModel):
    """The head's architecture and the target it was built for (saved as JSON)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: int = HEAD_FORMAT
    hidden_size: int = Field(ge=1)  # the target's hidden size (features in and out)
    target_vocab_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)  # the head's FFN, usually smaller than the target's
    rms_norm_eps: float = Field(gt=0)
    max_position_embeddings: int = Field(ge=1)
    rope_parameters: dict[str, Any]
    hidden_act: str = "silu"
    draft_vocab_size: int | None = Field(default=None, ge=1)  # None: the full vocabulary
    # The layout's three switches (heads saved before they existed have all three).
    fc_bias: bool = True
    input_norm: bool = True  # the decoder block's input RMSNorm
    output_norm: bool = True  # a final RMSNorm on the predicted feature

    @property
    def layout(self) -> str:
        """``specops``, ``eagle`` (EAGLE-1's, vLLM's ``eagle`` method) or ``custom``."""
        switches = (self.fc_bias, self.input_norm, self.output_norm)
        if all(switches):
            return "specops"
        return "eagle" if not any(switches) else "custom"

    def llama_config(self) -> LlamaConfig:
        """The one-layer Llama config of the head's decoder block."""
        config = LlamaConfig(
            vocab_size=self.target_vocab_size,  # unused: the head has no embedding of its own
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=1,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            hidden_act=self.hidden_act,
            max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters=dict(self.rope_parameters),
        )
        # The masks DraftHead builds are boolean SDPA masks (True: attend).
        config._attn_implementation = "sdpa"
        return config


def head_config_for(
    target: PreTrainedModel,
    *,
    intermediate_size: int | None = None,
    draft_vocab_size: int | None = None,
    layout: HeadLayout = "specops",
) -> HeadConfig:
    """A head for ``target``: its hidden size, heads and RoPE; ``intermediate_size`` defaults
    to the target's own FFN width; ``layout`` as :data:`HEAD_LAYOUTS`."""
    if layout not in HEAD_LAYOUTS:
        raise ValueError(f"unknown head layout {layout!r}; use one of {HEAD_LAYOUTS}")
    full = layout == "specops"
    config = target.config
    heads = int(config.num_attention_heads)
    rope = getattr(config, "rope_parameters", None) or {
        "rope_type": "default",
        "rope_theta": float(getattr(config, "rope_theta", 10000.0)),
    }
    return HeadConfig(
        hidden_size=int(config.hidden_size),
        target_vocab_size=int(config.vocab_size),
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
        intermediate_size=int(intermediate_size or config.intermediate_size),
        rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)),
        max_position_embeddings=int(config.max_position_embeddings),
        rope_parameters=dict(rope),
        hidden_act=str(getattr(config, "hidden_act", "silu")),
        draft_vocab_size=draft_vocab_size,
        fc_bias=full,
        input_norm=full,
        output_norm=full,
    )


def causal_mask(query_len: int, past_len: int, device: torch.device | None = None) -> torch.Tensor:
    """``[1, 1, query_len, past_len + query_len]`` bool, True where a query may attend.

    Always passed explicitly: with ``mask=None`` and a cache, transformers' SDPA path crops
    the keys to the query length (it assumes an empty cache).
    """
    query_pos = torch.arange(query_len, device=device)[:, None] + past_len  # [q, 1]
    key_pos = torch.arange(past_len + query_len, device=device)[None, :]  # [1, past + q]
    return (key_pos <= query_pos)[None, None]


class DraftHead(nn.Module):
    """``fc`` + one Llama decoder block + RMSNorm. Holds no target weights."""

    def __init__(self, config: HeadConfig, vocab_ids: torch.Tensor | None = None) -> None:
        super().__init__()
        self.head_config = config
        self.config = config.llama_config()  # what serving.engine.kv.new_cache reads
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=config.fc_bias)
        self.layer = LlamaDecoderLayer(self.config, layer_idx=0)
        if not config.input_norm:
            self.layer.input_layernorm = nn.Identity()  # type: ignore[assignment]
        self.norm = (
            LlamaRMSNorm(hidden, eps=config.rms_norm_eps) if config.output_norm else nn.Identity()
        )
        self.rotary = LlamaRotaryEmbedding(self.config)
        if (vocab_ids is None) != (config.draft_vocab_size is None):
            raise ValueError("vocab_ids must be given exactly when draft_vocab_size is set")
        if vocab_ids is not None:
            vocab_ids = _checked_vocab_ids(vocab_ids, config)
        # [draft_vocab] int64 full-vocabulary ids of the reduced vocabulary, or None.
        self.vocab_ids: torch.Tensor | None
        self.register_buffer("vocab_ids", vocab_ids)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(
        self,
        features: torch.Tensor,  # [batch, seq, hidden] f_i (true or predicted)
        token_embeds: torch.Tensor,  # [batch, seq, hidden] embedding of x_{i+1}
        position_ids: torch.Tensor,  # [batch, seq]
        attention_mask: torch.Tensor | None = None,  # [batch | 1, 1, seq, past + seq] bool
        cache: DynamicCache | None = None,
    ) -> torch.Tensor:
        """Predicted next features ``f̂_{i+1}`` ``[batch, seq, hidden]``."""
        hidden = self.fc(torch.cat([features, token_embeds], dim=-1))  # [batch, seq, hidden]
        position_embeddings = self.rotary(hidden, position_ids=position_ids)
        hidden = self.layer(
            hidden,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=cache is not None,
            position_embeddings=position_embeddings,
        )
        return self.norm(hidden)


def _checked_vocab_ids(vocab_ids: torch.Tensor, config: HeadConfig) -> torch.Tensor:
    vocab_ids = torch.as_tensor(vocab_ids, dtype=torch.int64).flatten()
    if vocab_ids.numel() != config.draft_vocab_size:
        raise ModelSourceError(
            f"the reduced vocabulary has {vocab_ids.numel()} ids but the head config says "
            f"draft_vocab_size={config.draft_vocab_size}"
        )
    if vocab_ids.numel() and (
        int(vocab_ids.min()) < 0 or int(vocab_ids.max()) >= config.target_vocab_size
    ):
        raise ModelSourceError(
            f"the reduced vocabulary holds ids outside [0, {config.target_vocab_size})"
        )
    if vocab_ids.unique().numel() != vocab_ids.numel():
        raise ModelSourceError("the reduced vocabulary repeats token ids")
    return vocab_ids


# ------------------------------------------------------------------ the target's frozen parts


def output_weight(target: PreTrainedModel) -> torch.Tensor:
    """The target's output-layer matrix ``[vocab, hidden]`` (shared with the embedding when
    tied). Packed and quantised layers keep no plain weight: a tied target still works through its
    embedding; an untied packed target must be loaded with ``kernels="stock"``."""
    weight = getattr(target.get_output_embeddings(), "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight
    if getattr(target.config, "tie_word_embeddings", False):
        return cast(torch.Tensor, target.get_input_embeddings().weight)
    raise IncompatibleDraftError(
        "the target's output layer is packed or quantised and not tied to its embedding, so "
        "the head cannot read its weights; load the target with kernels='stock'"
    )


def check_head_fits(config: HeadConfig, target: PreTrainedModel) -> None:
    """Raise :class:`IncompatibleDraftError` naming the mismatch if ``config`` is not for
    ``target``."""
    hidden, vocab = int(target.config.hidden_size), int(target.config.vocab_size)
    if config.hidden_size != hidden:
        raise IncompatibleDraftError(
            f"the draft head reads features of hidden size {config.hidden_size} but the "
            f"target's hidden size is {hidden}; train a head for this target"
        )
    if config.target_vocab_size != vocab:
        raise IncompatibleDraftError(
            f"the draft head was trained for a vocabulary of {config.target_vocab_size} tokens "
            f"but the target has {vocab}; train a head for this target"
        )


# ------------------------------------------------------------------------- save / load


def save_head(head: DraftHead, path: str | Path) -> Path:
    """Write ``head`` to the folder ``path`` atomically (a temporary folder renamed into
    place): config JSON + safetensors of the head's own weights and ``vocab_ids``."""
    from safetensors.torch import save_file

    path = Path(path)
    state = {name: tensor.detach().cpu().contiguous() for name, tensor in head.state_dict().items()}
    with atomic_dir(path) as work:
        (work / CONFIG_FILE).write_text(head.head_config.model_dump_json(indent=2))
        save_file(state, str(work / WEIGHTS_FILE), metadata={"format": str(HEAD_FORMAT)})
    return path


def read_head_config(path: str | Path) -> HeadConfig:
    path = Path(path)
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        raise ModelSourceError(
            f"{path} is not a draft-head folder: {CONFIG_FILE} is missing; give a folder "
            "written by save_head / train_head"
        )
    try:
        config = HeadConfig.model_validate(json.loads(config_file.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as exc:
        raise ModelSourceError(f"{config_file} is corrupt or not a head config: {exc}") from exc
    if config.format != HEAD_FORMAT:
        raise ModelSourceError(
            f"{config_file} has format {config.format}; this version reads format {HEAD_FORMAT}"
        )
    return config


def load_head(path: str | Path, target: PreTrainedModel | None = None) -> DraftHead:
    """Load a head saved by :func:`save_head`; with ``target``, check that it fits it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    config = read_head_config(path)
    if target is not None:
        check_head_fits(config, target)
    weights_file = path / WEIGHTS_FILE
    if not weights_file.is_file():
        raise ModelSourceError(f"{weights_file} is missing; the head folder is incomplete")
    try:
        state = load_file(str(weights_file))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelSourceError(f"{weights_file} is corrupt: {exc}") from exc
    if ("vocab_ids" in state) != (config.draft_vocab_size is not None):
        raise ModelSourceError(
            f"{weights_file} and {CONFIG_FILE} disagree on the reduced vocabulary "
            f"(draft_vocab_size={config.draft_vocab_size}); save the head again"
        )
    head = DraftHead(config, vocab_ids=state.get("vocab_ids"))
    try:
        head.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelSourceError(f"{weights_file} does not match {CONFIG_FILE}: {exc}") from exc
    return head.eval()
