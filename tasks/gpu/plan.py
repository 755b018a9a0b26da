"""What the GPU run kit runs on the GPU machine, in order, with each step's expected time
and its limit: the plan ``specops gpu kit --dry-run`` prints and ``run.sh`` follows.

The steps run in two commands, ``measure`` and ``learn``, so that neither runs past the ten
minutes a lent machine gives one command; the whole run is held to twelve minutes of GPU
time (both overridable when the kit is built). A step past its limit is killed and
recorded as such; the next still runs while time is left.
"""

from __future__ import annotations

from dataclasses import dataclass

COMMANDS = ("measure", "learn")
COMMAND_LIMIT_S = 600  # one command on a lent machine
TOTAL_BUDGET_S = 720  # all commands together


@dataclass(frozen=True)
class Step:
    name: str
    command: str  # the run.sh command it belongs to
    what: str
    expected_s: int  # on an H100/H200-class GPU, for the shipped model
    limit_s: int  # killed past this


STEPS: tuple[Step, ...] = (
    Step(
        "setup",
        "measure",
        "join the parts, convert the GGUF, install missing wheels, "
        "record the machine (GPU, driver, CUDA, clocks, torch, transformers)",
        40,
        150,
    ),
    Step(
        "tests",
        "measure",
        "the device tests: pytest tests/serving/test_device.py tests/serving/lean/test_graphed.py",
        60,
        180,
    ),
    Step(
        "profile",
        "measure",
        "verify and batch curves (medians of the repeats, with their spread)",
        90,
        240,
    ),
    Step(
        "bench",
        "measure",
        "the engine (plain, prompt lookup) against transformers' eager "
        "generate, its prompt lookup and its static-cache compiled generate",
        150,
        300,
    ),
    Step(
        "train",
        "learn",
        "the head and LoRA challengers on the kit's teacher data "
        "(configs/retrain.yaml's settings for the target, budgets scaled)",
        240,
        420,
    ),
    Step(
        "evaluate",
        "learn",
        "the bundle's champion and challengers with the trained ones, "
        "interleaved with plain decoding",
        90,
        240,
    ),
    Step(
        "vllm", "learn", "cuda-vllm where vLLM is importable there, else a line saying so", 30, 120
    ),
)
STEP_BY_NAME = {step.name: step for step in STEPS}


def steps_of(command: str) -> list[Step]:
    """The steps ``command`` runs: ``measure``, ``learn``, ``all`` or one step's name."""
    if command == "all":
        return list(STEPS)
    if command in COMMANDS:
        return [step for step in STEPS if step.command == command]
    if command in STEP_BY_NAME:
        return [STEP_BY_NAME[command]]
    from serving.errors import BadInputError

    raise BadInputError(
        f"unknown kit command {command!r}; choose one of {[*COMMANDS, 'all', *STEP_BY_NAME]}"
    )
