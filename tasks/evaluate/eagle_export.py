"""A specops draft head as the EAGLE-1 draft folder vLLM's ``eagle`` method loads.

vLLM's ``EagleLlamaForCausalLM`` (``vllm/model_executor/models/llama_eagle.py``) is
``fc(cat(embed(x_{i+1}), f_i))`` with no bias, Llama decoder blocks of which the first has
no input RMSNorm, no final norm, and the target's embedding and output layer (shared when
the folder has none of its own). A head in the ``eagle`` layout
(:data:`serving.models.head.HEAD_LAYOUTS`) is exactly that with one block, so the export is a
renaming: ``fc``'s two input halves swap places (specops concatenates the feature first),
``layer.*`` becomes ``layers.0.*``, and ``config.json`` is the target's Llama config cut to
one layer of the head's width. Both read the target's post-norm last hidden state, and
both give the pair ``(f_i, x_{i+1})`` position ``i``, so the drafts match up to float
rounding. Any other head is refused with what differs: a norm or bias vLLM's model lacks
would be silently dropped, and a reduced vocabulary needs EAGLE-3's draft-to-target map.
"""

from __future__ import annotations

import json
from pathlib import Path

from serving.backends import UnsupportedDraftError
from serving.errors import ModelSourceError
from serving.models.head import WEIGHTS_FILE, HeadConfig, read_head_config

CONFIG = "config.json"
WEIGHTS = "model.safetensors"


def eagle_refusal(config: HeadConfig) -> str | None:
    """Why vLLM's EAGLE-1 model cannot reproduce this head, or None if it can."""
    reasons = []
    if config.fc_bias:
        reasons.append("its fc layer has a bias (vLLM's EAGLE fc has none)")
    if config.input_norm:
        reasons.append("its block normalises its input (vLLM's first EAGLE block does not)")
    if config.output_norm:
        reasons.append("it normalises its output (vLLM's EAGLE model has no final norm)")
    if config.draft_vocab_size is not None:
        reasons.append(
            f"it drafts over a reduced vocabulary of {config.draft_vocab_size} tokens (vLLM's "
            "EAGLE-1 Llama drafts over the target's whole vocabulary)"
        )
    if not reasons:
        return None
    return (
        f"this head ({config.layout} layout) cannot run as vLLM's EAGLE-1 draft: "
        + "; ".join(reasons)
        + ". Train it with `layout: eagle` and no draft_vocab_size"
    )


def write_eagle_draft(head_dir: str | Path, target_dir: str | Path, out: str | Path) -> Path:
    """Write the head at ``head_dir`` (trained for the target at ``target_dir``) into the
    folder ``out`` as vLLM's EAGLE-1 draft: ``config.json`` and ``model.safetensors``."""
    import torch
    from safetensors.torch import load_file, save_file

    head_dir, target_dir, out = Path(head_dir), Path(target_dir), Path(out)
    config = read_head_config(head_dir)
    refusal = eagle_refusal(config)
    if refusal:
        raise UnsupportedDraftError(refusal)
    try:
        target_config = json.loads((target_dir / CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ModelSourceError(
            f"cannot read the target's {CONFIG} in {target_dir}: {error}"
        ) from None
    if target_config.get("model_type") != "llama":
        raise UnsupportedDraftError(
            f"vLLM's EAGLE-1 export is written for Llama targets; {target_dir} is "
            f"{target_config.get('model_type')!r}"
        )
    if (
        int(target_config["hidden_size"]) != config.hidden_size
        or int(target_config["vocab_size"]) != config.target_vocab_size
    ):
        raise UnsupportedDraftError(
            f"the head at {head_dir} was trained for another target (hidden size "
            f"{config.hidden_size}, vocabulary {config.target_vocab_size}) than {target_dir}"
        )
    weights = load_file(str(head_dir / WEIGHTS_FILE))
    hidden = config.hidden_size
    fc = weights.pop("fc.weight")  # [hidden, 2 * hidden] over cat(feature, embedding)
    # vLLM concatenates (embedding, feature): swap the halves of fc's input.
    tensors = {"fc.weight": torch.cat([fc[:, hidden:], fc[:, :hidden]], dim=1)}
    for name in list(weights):
        if name.startswith("layer."):
            tensors["layers.0." + name.removeprefix("layer.")] = weights.pop(name)
    if weights:
        raise ModelSourceError(
            f"the head at {head_dir} holds weights the EAGLE export does not map: {sorted(weights)}"
        )
    draft_config = {
        **target_config,
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 1,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "hidden_act": config.hidden_act,
        "dtype": "float32",
    }
    draft_config.pop("torch_dtype", None)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG).write_text(json.dumps(draft_config, indent=2))
    save_file(
        {name: t.contiguous() for name, t in tensors.items()},
        str(out / WEIGHTS),
        metadata={"format": "pt"},
    )
    return out
