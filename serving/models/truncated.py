"""A draft made of the target's first N decoder layers, sharing the target's weights.

No parameters are copied: the draft's embedding, first N layers, final norm and output
head are the target's own modules, so it costs no memory and any later fine-tuning of a
copy is explicit (see the training issue). A target on the lean step (:mod:`serving.lean`)
gives its draft the same kind of step over those layers:
:meth:`serving.target.LoadedTarget.over`.
"""

from __future__ import annotations

import copy

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from serving.errors import BadInputError


def first_layers(target: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """Return a causal LM that runs ``target``'s first ``num_layers`` layers and its head."""
    total = target.config.num_hidden_layers
    if not isinstance(num_layers, int) or not 1 <= num_layers < total:
        raise BadInputError(
            f"layers:N needs 1 <= N < {total} (the target's layer count), got {num_layers!r}"
        )
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    with torch.device("meta"):
        draft = AutoModelForCausalLM.from_config(config)
    draft.model.embed_tokens = target.model.embed_tokens
    draft.model.layers = torch.nn.ModuleList(target.model.layers[:num_layers])
    draft.model.norm = target.model.norm
    draft.model.rotary_emb = target.model.rotary_emb
    draft.lm_head = target.lm_head
    draft.generation_config = copy.deepcopy(target.generation_config)
    leftover = [name for name, p in draft.named_parameters() if p.is_meta]
    if leftover:
        raise BadInputError(f"cannot truncate {config.model_type!r}: unshared {leftover[:3]}")
    return draft.eval()
