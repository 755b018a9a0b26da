"""Load a target model and build a decoder for it from user-facing options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from serving.drafters.base import Drafter
from serving.drafters.factory import DrafterSpec, build_drafter, parse_drafter_spec
from serving.engine import SpeculativeDecoder
from serving.errors import BadInputError, ModelSourceError
from serving.hardware import engine_target
from serving.models.kernels import CPU_ONLY, KERNELS, apply_kernels, check_kernels
from serving.policy import DraftLengthPolicy, check_k, check_policy, make_policy
from serving.relaxed import check_lambda

DEFAULT_TARGET = "smollm2"


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
    *,
    kernels: str = "onednn",
    device: str | torch.device = "cpu",
    dtype: str = "float32",
    lean_mode: str | None = None,
):
    """``smollm2`` (the shipped SmolLM2-135M-Instruct) or a local HF model folder, loaded
    in ``dtype`` on ``device`` (a hardware target's ``load_options()`` gives all three).

    ``kernels`` (:mod:`serving.models.kernels`, one of ``KERNELS``): ``"onednn"`` packs the
    linear layers for oneDNN, ``"int8"``/``"int4"`` quantise their weights (all three float32
    on the CPU only); ``"stock"`` keeps torch's default layers. Every option is checked, and
    the quantised kernels probed, before any weights are read.

    ``lean_mode`` (default ``$SPECOPS_LEAN`` or ``auto``): whether the target decodes
    through the lean step (:mod:`serving.lean`) where it covers the model.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serving.lean.install import install, preflight

    if kernels not in KERNELS:
        raise BadInputError(f"unknown kernels {kernels!r}; choose one of {KERNELS}")
    if dtype not in DTYPES:
        raise BadInputError(f"unknown dtype {dtype!r}; choose one of {DTYPES}")
    if kernels in CPU_ONLY and (parse_device(device).type != "cpu" or dtype != "float32"):
        raise BadInputError(
            f"kernels {kernels!r} are for float32 layers on the CPU; on device "
            f"{str(device)!r} in {dtype} load with kernels='stock'"
        )
    check_kernels(kernels)
    target_device = check_device(device)
    lean = preflight(kernels, target_device.type, lean_mode)
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
    if target_device.type != "cpu":
        model = model.to(target_device)
    apply_kernels(model, kernels, fuse=lean)
    if lean:
        install(model, lean_mode)
    return model, tokenizer


def encode_prompt(tokenizer, text: str, *, chat: bool = True) -> list[int]:
    if not isinstance(text, str) or not text.strip():
        raise BadInputError("the prompt is empty; give some text")
    if chat and tokenizer.chat_template:
        return encode_messages(tokenizer, [{"role": "user", "content": text}])
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_messages(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a chat (``[{"role", "content"}, ...]``) with the generation prompt."""
    if not messages or not any(m.get("content", "").strip() for m in messages):
        raise BadInputError("the conversation is empty; give at least one non-empty message")
    if not tokenizer.chat_template:
        return encode_prompt(tokenizer, "\n\n".join(m["content"] for m in messages), chat=False)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


def eos_ids(model, tokenizer) -> list[int]:
    ids: set[int] = set()
    for source in (model.generation_config.eos_token_id, getattr(tokenizer, "eos_token_id", None)):
        if source is None:
            continue
        ids.update(source if isinstance(source, list) else [source])
    return sorted(ids)


@dataclass(frozen=True)
class DecoderOptions:
    drafter: str = "pld"
    k: int = 4
    policy: str = "fixed"
    hardware: str = "cpu"  # a target of configs/hardware.yaml (its measured verify curve)
    # A draft cascade (serving/cascade): its stages in order, e.g. "suffix,pld:3,head:PATH";
    # when given it replaces ``drafter`` and ``policy``, and ``k`` is its largest block.
    cascade: str | None = None
    predictor: str | None = None  # the cascade's acceptance predictor folder (None: running)
    relax_lambda: float | None = None  # opt-in relaxed verification; None/inf: lossless

    def check(self) -> DrafterSpec:
        check_lambda(self.relax_lambda)
        if self.cascade is not None:
            from serving.cascade.build import check_predictor_for, parse_stages

            check_k(self.k, name="the cascade's k")
            specs = parse_stages(self.cascade)
            engine_target(self.hardware)
            if self.predictor is not None:
                check_predictor_for(self.predictor, specs, self.hardware)
            return DrafterSpec("none")
        if self.predictor is not None:
            raise BadInputError("an acceptance predictor needs a cascade (--cascade STAGES)")
        check_policy(self.policy)
        engine_target(self.hardware)
        spec = parse_drafter_spec(self.drafter)
        if spec.kind != "none":
            make_policy(self.policy, self.k)  # validates k
        return spec


def build_decoder(model, tokenizer, options: DecoderOptions) -> SpeculativeDecoder:
    spec = options.check()
    hardware = engine_target(options.hardware)
    device = next(model.parameters()).device
    if device.type != hardware.device_type:
        # Its verify curve was measured there: a model elsewhere would decode, mis-timed.
        raise BadInputError(
            f"the model is on {device}, but hardware target {options.hardware!r} runs on "
            f"{hardware.device!r}; load it with load_target(source, "
            f"**engine_target({options.hardware!r}).load_options())"
        )
    drafter: Drafter | None
    policy: DraftLengthPolicy | None = None
    if options.cascade is not None:
        from serving.cascade.build import build_cascade

        drafter, policy = build_cascade(
            options.cascade,
            model,
            verify_curve=hardware.curve,
            tokenizer=tokenizer,
            k_max=options.k,
            predictor=options.predictor,
            hardware=options.hardware,
        )
    else:
        drafter = build_drafter(spec, model, tokenizer)
        if drafter is not None:
            policy = make_policy(options.policy, options.k, verify_curve=hardware.curve)
    return SpeculativeDecoder(
        model,
        drafter=drafter,
        policy=policy,
        eos_token_ids=eos_ids(model, tokenizer),
        relax_lambda=options.relax_lambda,
    )
