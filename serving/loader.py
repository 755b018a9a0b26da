"""Load a target model (:class:`serving.target.LoadedTarget`) for a hardware target, and
encode prompts for it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from serving.errors import BadInputError, ModelSourceError
from serving.hardware import DEFAULT_HARDWARE, HardwareTarget, engine_target
from serving.models.kernels import CPU_ONLY, check_kernels
from serving.target import DEFAULT_TARGET, LoadedTarget, prepare_target

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def set_threads(threads: int) -> int:
    """Set torch's intra-op thread count explicitly (benchmarks record it)."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise BadInputError(f"threads must be an integer >= 1, got {threads!r}")
    torch.set_num_threads(threads)
    return threads


DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "bfloat16", "float16")


def parse_device(device: str | torch.device) -> torch.device:
    """``device`` as a :class:`torch.device` of a type the engine runs on."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise BadInputError(f"unknown device {device!r}; use one of {DEVICES}") from None
    if parsed.type not in DEVICES:
        raise BadInputError(f"the engine runs on {DEVICES}, not on device {str(device)!r}")
    return parsed


def check_device(device: str | torch.device) -> torch.device:
    """:func:`parse_device`, and a :class:`BadInputError` naming the device when this
    machine does not have it (instead of a CUDA traceback at the first tensor moved)."""
    parsed = parse_device(device)
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise BadInputError(
                f"device {str(device)!r} was asked for, but this torch sees no CUDA GPU (torch "
                f"{torch.__version__}, CUDA build {torch.version.cuda}); use device 'cpu' "
                "(hardware target cpu) or run on a machine with an NVIDIA GPU"
            )
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise BadInputError(
                f"device {str(device)!r} does not exist: this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)"
            )
    return parsed


def load_target(
    source: str = DEFAULT_TARGET,
    hardware: HardwareTarget | None = None,
    *,
    lean_mode: str | None = None,
) -> LoadedTarget:
    """``smollm2`` (the shipped SmolLM2-135M-Instruct) or a local HF model folder, loaded
    for ``hardware`` (default :data:`serving.hardware.DEFAULT_HARDWARE`): in its dtype, on
    its device, its linear layers on its kernels (:mod:`serving.models.kernels`: ``onednn``
    packs them for oneDNN, ``int8``/``int4`` quantise them, ``stock`` keeps torch's), and
    on the lean step (:mod:`serving.lean`) where that covers it (``lean_mode``: default
    ``$SPECOPS_LEAN`` or ``auto``). Every option is checked, and the quantised kernels
    probed, before any weights are read."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serving.lean.install import preflight

    hardware = hardware or engine_target(DEFAULT_HARDWARE)
    kernels, dtype = hardware.kernels, hardware.dtype
    if kernels in CPU_ONLY and (parse_device(hardware.device).type != "cpu" or dtype != "float32"):
        raise BadInputError(
            f"kernels {kernels!r} are for float32 layers on the CPU; on device "
            f"{hardware.device!r} in {dtype} load with kernels='stock'"
        )
    check_kernels(kernels)
    target_device = check_device(hardware.device)
    preflight(kernels, target_device.type, lean_mode)
    if source == DEFAULT_TARGET:
        from serving.models.real import load_real_model

        model, tokenizer = load_real_model(dtype=dtype)
    else:
        path = Path(source)
        if not path.is_dir():
            raise ModelSourceError(
                f"target {source!r} is neither {DEFAULT_TARGET!r} nor a local model folder"
            )
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
    return prepare_target(model, hardware, tokenizer, source=source, lean_mode=lean_mode)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, text: str, *, chat: bool = True) -> list[int]:
    if not isinstance(text, str) or not text.strip():
        raise BadInputError("the prompt is empty; give some text")
    if chat and tokenizer.chat_template:
        return encode_messages(tokenizer, [{"role": "user", "content": text}])
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_messages(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]
) -> list[int]:
    """Token ids of a chat (``[{"role", "content"}, ...]``) with the generation prompt."""
    if not messages or not any(m.get("content", "").strip() for m in messages):
        raise BadInputError("the conversation is empty; give at least one non-empty message")
    if not tokenizer.chat_template:
        return encode_prompt(tokenizer, "\n\n".join(m["content"] for m in messages), chat=False)
    ids: Any = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)
