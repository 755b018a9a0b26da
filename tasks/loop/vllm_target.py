"""Which hardware targets ``specops deploy vllm`` and ``deploy cycle`` take: a vLLM target
that runs on this machine, with vLLM's environment installed. Checked before anything is
registered, promoted or started."""

from __future__ import annotations

from serving.errors import BadInputError
from serving.hardware import HardwareTarget
from tasks.evaluate.targets import backend_python, check_runnable, runnable_target


def vllm_target(name: str, *, installed: bool = True) -> HardwareTarget:
    """The hardware target named ``name`` (a command's ``--hardware``), checked by
    :func:`check_vllm`."""
    return check_vllm(runnable_target(name), installed=installed)


def check_vllm(hardware: HardwareTarget, *, installed: bool = True) -> HardwareTarget:
    """``hardware``, refused unless it is a vLLM target that runs here and (with
    ``installed``) vLLM's environment exists (the refusal names its install command)."""
    check_runnable(hardware)
    if hardware.backend != "vllm":
        raise BadInputError(
            f"hardware target {hardware.name!r} runs on {hardware.backend!r}, not vLLM; "
            "`specops deploy vllm` serves vLLM targets (cpu-vllm, cuda-vllm)"
        )
    if installed:
        backend_python("vllm")
    return hardware
