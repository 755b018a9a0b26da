"""``specops bench``: specops against the baselines a user would otherwise pick.

In one run, on real workloads, interleaved: Hugging Face ``generate`` greedy, HF assisted
generation with the same model draft, HF prompt lookup, every specops drafter on one or
more hardware targets (each its own weight format: ``hardware`` per method), and llama.cpp
plain and prompt-lookup decoding of the shipped GGUF in its own environment
(:mod:`tasks.bench.llamacpp`; skipped, with the install command, where that environment
does not exist). Every method decodes the same token ids (the bench's tokenizer and chat
template) with the same budget. Each method gets one warm-up generation; then, prompt by
prompt, every method runs once in an order that rotates per prompt, so machine noise lands
on all methods alike.

Each row is checked token for token against its *reference* (:func:`pick_references`): a
specops row against the plain specops row (no drafter) on the same hardware target, a
llama.cpp row against llama.cpp plain, everything else (and those plain rows themselves)
against HF greedy. Beside tokens/s, the speedup over HF greedy, the ratio to llama.cpp
plain (``x llama``), acceptance and mean accepted length, each row shows the physical
limit of plain decoding for its weight format, ``limit tok/s`` = measured memory bandwidth
÷ weight bytes read per generated token, and its tokens/s as a share of it
(:mod:`tasks.bench.limits` defines both). The result is a JSON file, a table and a plot.
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from serving.atomic import write_json_atomic
from serving.errors import SpecOpsError
from serving.hardware import HardwareTarget, engine_target
from serving.loader import set_threads
from serving.target import DEFAULT_TARGET, LoadedTarget
from tasks.bench.bench_config import (
    BASELINE,
    DEFAULT_CONFIG,
    BenchConfig,
    MethodConfig,
    engine_key,
    llamacpp_reference,
    load_bench_config,
    method_hardware,
    pick_references,
    resolve_hardware,
    select_methods,
)
from tasks.bench.bench_report import format_table, plot, summarize
from tasks.bench.bench_runners import Outcome, Runner, make_runners
from tasks.bench.limits import (
    Bandwidth,
    cpu_description,
    gguf_weights,
    limit_tokens_per_s,
    memory_bandwidth,
    weight_bytes_per_token,
)
from tasks.bench.llamacpp import LlamaCppProcess, LlamaCppUnavailable, llamacpp_python
from tasks.data.prompts import Prompt
from tasks.evaluate.evaluate import EncodedPrompt
from tasks.evaluate.interleave import interleave

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

# Re-exported: the CLI, the GPU run kit and the tests import these from here.
__all__ = [
    "BASELINE",
    "DEFAULT_CONFIG",
    "BenchConfig",
    "MethodConfig",
    "Outcome",
    "format_table",
    "llamacpp_reference",
    "load_bench_config",
    "load_bench_targets",
    "make_runners",
    "method_hardware",
    "pick_references",
    "plot",
    "resolve_hardware",
    "run_bench",
    "select_methods",
    "summarize",
]


def _llamacpp_model(config: BenchConfig, target: str) -> Path:
    if config.llamacpp_model:
        path = Path(config.llamacpp_model)
        if not path.is_file():
            raise LlamaCppUnavailable(f"llamacpp_model {str(path)!r} is not a file")
        return path
    if target != DEFAULT_TARGET:
        raise LlamaCppUnavailable(
            f"llama.cpp decodes a GGUF file, and target {target!r} is a model folder; set "
            "llamacpp_model in the bench config to its GGUF"
        )
    from serving.models.real import gguf_path

    try:
        return gguf_path()
    except SpecOpsError as error:
        raise LlamaCppUnavailable(str(error)) from None


def _n_ctx(prompt_lengths: list[int], config: BenchConfig) -> int:
    """llama.cpp's context: the longest prompt, the budget and one draft block, in 256s."""
    lookahead = max(
        (m.num_pred_tokens for m in config.methods if m.engine == "llamacpp"), default=0
    )
    needed = max(prompt_lengths) + config.max_new_tokens + lookahead + 1
    return -(-needed // 256) * 256


def load_bench_targets(
    source: str,
    config: BenchConfig,
    hardware: dict[str, HardwareTarget],
    main: HardwareTarget,
) -> tuple[LoadedTarget, dict[str, LoadedTarget], list[PreTrainedModel]]:
    """``source`` loaded for every method: the stock target the HF baselines run (stock
    kernels on ``main``'s device and dtype), the target of each specops method by
    :func:`engine_key` (on its hardware target of ``hardware``), and the distinct models
    they hold. One model is loaded per distinct way of loading (kernels, device, dtype,
    lean step), shared by the targets that load alike."""
    from serving.loader import load_target

    def way(spec: HardwareTarget, lean_mode: str | None) -> tuple[str, ...]:
        return (spec.kernels, spec.device, spec.dtype, lean_mode or "")

    stock_hardware = main.model_copy(update={"kernels": "stock"})
    stock = load_target(source, stock_hardware)
    loaded: dict[tuple[str, ...], LoadedTarget] = {way(stock_hardware, None): stock}
    engine_targets: dict[str, LoadedTarget] = {}
    for method in config.methods:
        name = engine_key(method, config)
        if name is None or name in engine_targets:
            continue
        spec = hardware[str(method_hardware(method, config))]
        lean_mode = "off" if method.step == "transformers" else None
        key = way(spec, lean_mode)
        if key not in loaded:
            loaded[key] = load_target(source, spec, lean_mode=lean_mode)
        # The same model (and step), decoded with this method's hardware target's curves.
        engine_targets[name] = replace(loaded[key], hardware=spec)
    return stock, engine_targets, [target.model for target in loaded.values()]


def _llamacpp_setup(
    config: BenchConfig, target: str
) -> tuple[Path | None, Path | None, list[dict]]:
    """llama.cpp's interpreter and the GGUF it decodes, or (both ``None``) its methods listed
    as skipped with the reason when its environment or model is missing."""
    if not any(m.engine == "llamacpp" for m in config.methods):
        return None, None, []
    try:
        return llamacpp_python(), _llamacpp_model(config, target), []
    except LlamaCppUnavailable as error:
        return None, None, _skip_llamacpp(config, error)


def _skip_llamacpp(config: BenchConfig, error: LlamaCppUnavailable) -> list[dict]:
    """The llama.cpp methods as ``skipped`` entries, with why (and a warning in the log)."""
    llama_methods = [m.name for m in config.methods if m.engine == "llamacpp"]
    log.warning("skipping %s: %s", ", ".join(llama_methods), error)
    return [{"method": name, "reason": str(error)} for name in llama_methods]


def _bench_prompts(config: BenchConfig) -> list[Prompt]:
    """The config's workloads, ``prompts_per_workload`` prompts each."""
    from tasks.data.traffic import build_workload

    return [
        prompt
        for workload in config.workloads
        for prompt in build_workload(
            workload, config.prompts_per_workload, seed=config.seed, split=config.split
        )
    ]


def _method_weights(
    config: BenchConfig,
    hardware: dict[str, HardwareTarget],
    stock: LoadedTarget,
    engine_targets: dict[str, LoadedTarget],
    models: list[PreTrainedModel],
    gguf: Path | None,
) -> dict[str, dict]:
    """Each method's weight format and the bytes it reads per generated token: the stock
    model for HF, its hardware target's model for specops, the GGUF for llama.cpp."""
    footprints = {id(m): weight_bytes_per_token(m) for m in models}
    stock_dtype = str(stock.dtype).removeprefix("torch.")
    weights: dict[str, dict] = {}
    gguf_read = gguf_weights(gguf) if gguf is not None else None
    llama_weights = (
        {"format": f"gguf {gguf_read.format}", "bytes_per_token": gguf_read.bytes_per_token}
        if gguf_read is not None
        else None
    )
    for method in config.methods:
        hw_name = method_hardware(method, config)
        if method.engine == "llamacpp":
            if llama_weights is not None:
                weights[method.name] = dict(llama_weights)
        elif hw_name is None:  # HF: the stock model
            weights[method.name] = {
                "format": f"{stock_dtype} stock",
                "bytes_per_token": footprints[id(stock.model)],
            }
        else:
            engine = engine_targets[str(engine_key(method, config))]
            weights[method.name] = {
                "format": hw_name,
                "kernels": hardware[hw_name].kernels,
                "bytes_per_token": footprints[id(engine.model)],
            }
    return weights


def _start_llamacpp(
    config: BenchConfig, python: Path, gguf: Path, encoded: list[list[int]]
) -> LlamaCppProcess:
    """llama.cpp serving ``gguf``, its context sized for ``encoded`` (raises
    :class:`LlamaCppUnavailable` when it does not start)."""
    return LlamaCppProcess(
        gguf,
        threads=config.threads,
        n_ctx=_n_ctx([len(ids) for ids in encoded], config),
        prompt_lookup_tokens=tuple(
            m.num_pred_tokens
            for m in config.methods
            if m.engine == "llamacpp" and m.mode == "prompt_lookup"
        ),
        python=python,
    )


def _environment(
    config: BenchConfig,
    main: HardwareTarget,
    hardware: dict[str, HardwareTarget],
    bandwidth: Bandwidth,
    weights: dict[str, dict],
    llama: LlamaCppProcess | None,
    load_before: tuple[float, float, float],
) -> dict:
    """What the numbers were measured on: threads, targets, bandwidth, weights, machine."""
    return {
        "threads": torch.get_num_threads(),
        "specops_hardware": config.hardware,
        "specops_kernels": main.kernels,
        "specops_targets": {name: spec.load_options() for name, spec in hardware.items()},
        "memory_bandwidth": bandwidth.to_dict(),
        "weights": weights,
        "llamacpp": llama.info if llama is not None else None,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu": cpu_description(),
        "cpu_count": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "python": platform.python_version(),
    }


def run_bench(
    config: BenchConfig,
    *,
    out_dir: Path = Path("results"),
    target: str = DEFAULT_TARGET,
    progress: bool = True,
    prompts: Sequence[EncodedPrompt | Prompt] | None = None,
    draw: bool = True,
) -> dict:
    """Run the benchmark; write ``bench.json`` and (``draw``) ``bench.png`` into ``out_dir``.

    ``prompts`` (token ids, e.g. a GPU run kit's) replace the config's workloads. HF methods
    run the target on the device and dtype of the config's hardware target (stock kernels).
    llama.cpp methods whose environment or model is missing are left out and listed under
    ``skipped`` with the reason (and logged); the rest of the bench runs."""
    from serving.loader import encode_messages

    set_threads(config.threads)
    load_before = os.getloadavg()  # other work on the machine shows in every timing
    hardware = resolve_hardware(config)  # every target checked before any weights are read
    references = pick_references(config)
    llama_python, gguf, skipped = _llamacpp_setup(config, target)
    if prompts is None:
        prompts = _bench_prompts(config)
    main = hardware.get(config.hardware) or engine_target(config.hardware, require_curve=False)
    stock, engine_targets, models = load_bench_targets(target, config, hardware, main)
    tokenizer = stock.tokenizer
    assert tokenizer is not None  # load_target loads the source's tokenizer
    encoded = [
        p.token_ids if isinstance(p, EncodedPrompt) else encode_messages(tokenizer, p.messages)
        for p in prompts
    ]

    bandwidth = memory_bandwidth(config.bandwidth_mb)
    weights = _method_weights(config, hardware, stock, engine_targets, models, gguf)
    llama: LlamaCppProcess | None = None
    try:
        if llama_python is not None and gguf is not None:
            try:
                llama = _start_llamacpp(config, llama_python, gguf, encoded)
            except LlamaCppUnavailable as error:
                skipped = _skip_llamacpp(config, error)
        runners = make_runners(stock, engine_targets, config, llamacpp=llama)
        names = list(runners)
        runs = _interleave(runners, list(prompts), encoded, references, progress=progress)
    finally:
        if llama is not None:
            llama.close()
    llama_plain = llamacpp_reference(config) if llama is not None else None
    rows = summarize(
        runs,
        names,
        references=references,
        baseline=config.baseline,
        llamacpp_plain=llama_plain,
        weights=weights,
        bandwidth_bytes_per_s=bandwidth.bytes_per_s,
    )
    for weight in weights.values():
        weight["limit_tokens_per_s"] = limit_tokens_per_s(
            bandwidth.bytes_per_s, weight["bytes_per_token"]
        )
    results = {
        "config": config.model_dump(),
        "environment": _environment(config, main, hardware, bandwidth, weights, llama, load_before),
        "references": {name: references[name] for name in names},
        "skipped": skipped,
        "summary": rows,
        "runs": runs,
    }
    out_dir = Path(out_dir)
    write_json_atomic(out_dir / "bench.json", results)
    if draw:
        plot(rows, out_dir / "bench.png", hardware=config.hardware)
    return results


def _interleave(
    runners: dict[str, Runner],
    prompts: list,
    encoded: list[list[int]],
    references: dict[str, str | None],
    *,
    progress: bool,
) -> list[dict]:
    """One warm-up each, then every method once per prompt in a rotating order
    (:func:`tasks.evaluate.interleave.interleave`). A row's ``seconds`` are its runner's own
    (llama.cpp times itself, without the pipe)."""
    from tqdm.auto import tqdm

    names = list(runners)
    bar = tqdm(total=len(prompts) * len(names), desc="bench", disable=not progress)

    # The longest prompt: a static KV cache (hf-static) is sized once, for every prompt
    # after it (transformers keeps the largest), so no timed run recompiles.
    longest = max(encoded, key=len)

    def warm_up(name: str) -> None:
        bar.set_postfix_str(f"warm-up:{name}")
        runners[name](longest)

    def show(name: str, index: int) -> None:
        bar.set_postfix_str(f"{prompts[index].workload}:{name}")

    calls = {name: (lambda index, name=name: runners[name](encoded[index])) for name in names}
    rounds = interleave(
        calls, len(prompts), warm_up=warm_up, on_start=show, on_end=lambda *_: bar.update()
    )
    runs: list[dict] = []
    for prompt, prompt_ids, timed in zip(prompts, encoded, rounds, strict=True):
        outcomes = {name: run.value for name, run in timed.items()}
        for name in names:
            outcome = outcomes[name]
            reference = references.get(name)
            runs.append(
                {
                    "prompt_id": prompt.id,
                    "workload": prompt.workload,
                    "method": name,
                    "prompt_tokens": len(prompt_ids),
                    "token_ids": outcome.token_ids,
                    "seconds": outcome.seconds,
                    "reference": reference,
                    "identical": reference is None
                    or outcome.token_ids == outcomes[reference].token_ids,
                    "stats": outcome.stats,
                }
            )
    bar.close()
    return runs
