"""A model in memory as a server given it serves it (``build_state(config, target=...)``)."""

from __future__ import annotations

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from serving.hardware import engine_target
from serving.target import LoadedTarget, eos_ids


def served_target(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, hardware: str = "cpu"
) -> LoadedTarget:
    """``model`` taken as it is (no kernels applied, no lean step) on hardware target
    ``hardware`` (the server config's), stopping at its model's and its tokenizer's
    end-of-sequence ids."""
    return LoadedTarget.of(
        model, tokenizer, hardware=engine_target(hardware), eos_token_ids=eos_ids(model, tokenizer)
    )
