"""Which hardware targets ``specops deploy vllm`` and ``deploy cycle`` take: a vLLM target
that runs on this machine, with vLLM's environment installed. Checked before anything is
registered, promoted or started."""

from __future__ import annotations

from serving.errors import BadInputError
from serving.hardware import HardwareTarget
from tasks.evaluate.targets import backend_python, runnable_target


def vllm_target(hardware: str, *, installed: bool = True) -> HardwareTarget:
    """``hardware``'s settings; refused unless it is a vLLM target that runs here and (with
    ``installed``) vLLM's environment exists (the refusal names its install command)."""
    target = runnable_target(hardware)
    if target.backend != "vllm":
        raise BadInputError(
            f"hardware target {hardware!r} runs on {target.backend!r}, not vLLM; "
            "`specops deploy vllm` serves vLLM targets (cpu-vllm, cuda-vllm)"
        )
    if installed:
        backend_python("vllm")
    return target
