"""The ``specops`` command line. Thin: parse options, call serving/ and tasks/, print."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from specops.cascade_cli import cascade_app
from specops.chat_cli import chat
from specops.data_cli import data_app
from specops.deploy_cli import deploy_app
from specops.distributed_cli import distributed_app
from specops.draft_cli import register_draft_commands
from specops.exit import fail
from specops.loop_cli import loop_app
from specops.predictor_cli import predictor_app
from specops.quality_cli import quality
from specops.registry_cli import registry_app
from specops.stack_cli import stack_app
from specops.targets_cli import targets_app
from specops.teacher_cli import teacher_app

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

app = typer.Typer(
    help="specops: speculative decoding that keeps itself fast.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main(
    tracking_uri: Annotated[
        str | None,
        typer.Option(
            "--tracking-uri",
            help="The MLflow tracking store for this command (over MLFLOW_TRACKING_URI, "
            "SPECOPS_MLFLOW_URI and configs/registry.yaml): http://host:5000, "
            "postgresql://user@host/db, sqlite:///path. docs/configuration.md.",
        ),
    ] = None,
    registry_uri: Annotated[
        str | None,
        typer.Option(
            "--registry-uri",
            help="The MLflow model registry, if not the tracking store (over MLFLOW_REGISTRY_URI).",
        ),
    ] = None,
    registry_config: Annotated[
        Path | None,
        typer.Option(
            "--registry-config",
            help="The registry's YAML file instead of configs/registry.yaml (over "
            "SPECOPS_REGISTRY_CONFIG).",
        ),
    ] = None,
) -> None:
    """specops: speculative decoding that keeps itself fast."""
    # The top layer of the registry's settings, for this process and those it starts;
    # checked here when given, so that a bad one fails before any command runs.
    from registry.config import load_registry_config, set_overrides
    from serving.errors import SpecOpsError

    set_overrides(tracking_uri=tracking_uri, registry_uri=registry_uri, config_file=registry_config)
    if tracking_uri or registry_uri or registry_config:
        try:
            load_registry_config()
        except SpecOpsError as error:
            fail(str(error))


app.add_typer(data_app, name="data")
app.add_typer(distributed_app, name="distributed")
app.add_typer(cascade_app, name="cascade")
app.add_typer(registry_app, name="registry")
app.add_typer(stack_app, name="stack")
app.add_typer(deploy_app, name="deploy")
register_draft_commands(app)
app.add_typer(loop_app, name="loop")
app.add_typer(predictor_app, name="predictor")
app.add_typer(targets_app, name="targets")
app.add_typer(teacher_app, name="teacher")
app.command("quality")(quality)
app.command("chat")(chat)


def _format_stats(stats: dict) -> str:
    def fmt(value, spec=".3f"):
        return "n/a" if value is None else format(value, spec)

    by_position = ", ".join(fmt(v, ".2f") for v in stats["acceptance_by_position"]) or "n/a"
    return (
        f"tokens: {stats['generated_tokens']} in {stats['checks']} target passes | "
        f"{fmt(stats['tokens_per_s'], '.1f')} tok/s | acceptance {fmt(stats['acceptance_rate'])}"
        f" | mean accepted length {fmt(stats['mean_accepted_length'], '.2f')}\n"
        f"acceptance by position: [{by_position}]\n"
        f"time: prefill {stats['prefill_s']:.3f}s, draft {stats['draft_s']:.3f}s, "
        f"verify {stats['verify_s']:.3f}s, total {stats['total_s']:.3f}s"
    )


@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt text.")],
    drafter: Annotated[
        str,
        typer.Option(
            help="none | pld[:N] | ngram[:N] | suffix[:PATH] | layers:N | model:PATH | head:PATH"
        ),
    ] = "pld",
    k: Annotated[
        int,
        typer.Option("--k", help="Draft tokens per step (fixed), start (adaptive), max (cost)."),
    ] = 10,
    policy: Annotated[
        str, typer.Option(help="Draft-length policy: cost | fixed | adaptive.")
    ] = "cost",
    max_new_tokens: Annotated[int, typer.Option(help="Token budget.")] = 128,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option(help="0 disables.")] = 0,
    top_p: Annotated[float, typer.Option(help="1.0 disables.")] = 1.0,
    seed: Annotated[int | None, typer.Option(help="Seed for sampling.")] = None,
    mode: Annotated[str, typer.Option(help="fast | detailed (records disagreements).")] = "fast",
    chat: Annotated[bool, typer.Option("--chat/--no-chat", help="Apply the chat template.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    threads: Annotated[int, typer.Option(help="torch threads.")] = 2,
    target: Annotated[str, typer.Option(help="smollm2 or a local model folder.")] = "smollm2",
    hardware: Annotated[str, typer.Option(help="Hardware target (configs/hardware.yaml).")] = "cpu",
    cascade: Annotated[
        str | None,
        typer.Option(
            help="A draft cascade instead of --drafter: stages in order, e.g. suffix,pld:3."
        ),
    ] = None,
    predictor: Annotated[
        str | None, typer.Option(help="The cascade's acceptance predictor folder.")
    ] = None,
    relax_lambda: Annotated[
        float | None,
        typer.Option(
            "--lambda",
            help="Relaxed verification (opt-in, greedy): keep a disagreeing draft when λ x its "
            "log-probability gap < the passes it saves. Default: lossless.",
        ),
    ] = None,
    skeleton: Annotated[
        bool,
        typer.Option(
            "--skeleton",
            help="Skeleton-of-thought: a constrained plan, then its points decoded as one "
            "batch and merged (docs/skeleton.md); --max-new-tokens bounds each point.",
        ),
    ] = False,
) -> None:
    """Generate text for PROMPT with speculative decoding; print the text and the stats."""
    from serving.engine import MODES
    from serving.errors import SpecOpsError
    from serving.hardware import engine_target
    from serving.loader import (
        DecoderOptions,
        build_decoder,
        encode_prompt,
        load_target,
        set_threads,
    )
    from serving.sampling import SamplingParams

    try:
        # Every option is checked before any model is loaded.
        if not prompt.strip():
            fail("the prompt is empty; give some text")
        if mode not in MODES:
            fail(f"unknown mode {mode!r}; choose one of {MODES}")
        if max_new_tokens < 1:
            fail(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        options = DecoderOptions(
            drafter=drafter,
            k=k,
            policy=policy,
            hardware=hardware,
            cascade=cascade,
            predictor=predictor,
            relax_lambda=relax_lambda,
        )
        options.check()
        if skeleton and not chat:
            fail("--skeleton needs the chat template (drop --no-chat)")
        set_threads(threads)
        model, tokenizer = load_target(target, kernels=engine_target(hardware).kernels)
        if skeleton:
            _generate_skeleton(model, tokenizer, prompt, options, max_new_tokens, sampling, as_json)
            return
        prompt_ids = encode_prompt(tokenizer, prompt, chat=chat)
        decoder = build_decoder(model, tokenizer, options)
        generation = decoder.stream(
            prompt_ids, max_new_tokens=max_new_tokens, sampling=sampling, mode=mode
        )
        shown = ""
        ids: list[int] = []
        for event in generation:
            ids.append(event.token_id)
            if not as_json:
                text = tokenizer.decode(ids, skip_special_tokens=True)
                sys.stdout.write(text[len(shown) :])
                sys.stdout.flush()
                shown = text
        result = generation.result
    except SpecOpsError as error:
        fail(str(error))
    assert result is not None
    text = tokenizer.decode(result.token_ids, skip_special_tokens=True)
    stats = result.stats.to_dict()
    if as_json:
        payload = {
            "text": text,
            "token_ids": result.token_ids,
            "from_draft": result.from_draft,
            "unverified": result.unverified,
            "stop_reason": result.stop_reason,
            "stats": stats,
            "drafter": decoder.describe(),
            "threads": threads,
        }
        if result.record is not None:
            payload["record"] = result.record.to_dict()
        typer.echo(json.dumps(payload))
        return
    typer.echo("")
    typer.echo("---", err=True)
    typer.echo(_format_stats(stats), err=True)
    if result.unverified:
        typer.echo(
            f"kept unverified (relaxed, λ={relax_lambda}): {len(result.unverified)} tokens at "
            f"positions {result.unverified[:20]}",
            err=True,
        )
    if result.record is not None:
        typer.echo(f"disagreements recorded: {len(result.record.disagreements)}", err=True)


def _generate_skeleton(model, tokenizer, prompt, options, max_new_tokens, sampling, as_json):
    from serving.hardware import engine_target
    from serving.loader import build_decoder, eos_ids
    from serving.skeleton.constraint import SkeletonConstraint
    from serving.skeleton.decode import answer_with_skeleton

    target = engine_target(options.hardware)
    constraint = SkeletonConstraint(
        tokenizer, vocab_size=int(model.config.vocab_size), eos_token_ids=eos_ids(model, tokenizer)
    )
    answer = answer_with_skeleton(
        lambda: build_decoder(model, tokenizer, options),
        tokenizer,
        prompt,
        constraint,
        max_tokens=max_new_tokens,
        sampling=sampling,
        limits=target.batch_limits(),
        cost=target.pass_cost(),
    )
    summary = {
        "text": answer.text,
        "skeleton": answer.skeleton_text,
        "direct": answer.skeleton.direct,
        "branches": [vars(b) for b in answer.branches],
        "truncated": answer.truncated,
        "completion_tokens": answer.completion_tokens,
        "skeleton_s": round(answer.skeleton_s, 3),
        "answer_s": round(answer.answer_s, 3),
    }
    if as_json:
        typer.echo(json.dumps(summary))
        return
    typer.echo(answer.text)
    typer.echo("---", err=True)
    typer.echo(f"skeleton: {answer.skeleton_text!r}", err=True)
    cut = [i + 1 for i, b in enumerate(answer.branches) if b.truncated]
    typer.echo(
        f"{answer.completion_tokens} tokens; skeleton {answer.skeleton_s:.2f} s, answer "
        f"{answer.answer_s:.2f} s" + (f"; points {cut} hit --max-new-tokens" if cut else ""),
        err=True,
    )


@app.command("bench-skeleton")
def bench_skeleton(
    prompts: Annotated[int, typer.Option(help="Planning prompts (held-out ShareGPT).")] = 12,
    max_tokens: Annotated[int, typer.Option(help="Token budget per point.")] = 64,
    plain_max_tokens: Annotated[int, typer.Option(help="Budget of the plain answer.")] = 256,
    drafter: Annotated[str, typer.Option(help="Drafter of every request.")] = "pld",
    policy: Annotated[str, typer.Option(help="cost | fixed | adaptive.")] = "cost",
    k: Annotated[int, typer.Option("--k", help="The policy's k.")] = 8,
    threads: Annotated[int, typer.Option(help="torch threads.")] = 2,
    hardware: Annotated[str, typer.Option(help="Hardware target.")] = "cpu",
    seed: Annotated[int, typer.Option(help="Prompt-selection seed.")] = 0,
    out: Annotated[Path, typer.Option(help="Results file.")] = Path("results/skeleton.json"),
) -> None:
    """Skeleton-of-thought against the same requests one at a time and a plain answer, on
    the planning workload; write a results file."""
    from serving.errors import SpecOpsError
    from serving.hardware import engine_target
    from serving.loader import DecoderOptions, build_decoder, eos_ids, load_target, set_threads
    from serving.skeleton.constraint import SkeletonConstraint
    from tasks.bench.skeleton import run_skeleton_bench, write_results

    try:
        options = DecoderOptions(drafter=drafter, k=k, policy=policy, hardware=hardware)
        options.check()
        target = engine_target(hardware)
        set_threads(threads)
        model, tokenizer = load_target("smollm2", **target.load_options())
        constraint = SkeletonConstraint(
            tokenizer,
            vocab_size=int(model.config.vocab_size),
            eos_token_ids=eos_ids(model, tokenizer),
        )
        results = run_skeleton_bench(
            model,
            tokenizer,
            lambda: build_decoder(model, tokenizer, options),
            constraint,
            prompts=prompts,
            max_tokens=max_tokens,
            plain_max_tokens=plain_max_tokens,
            limits=target.batch_limits(),
            cost=target.pass_cost(),
            seed=seed,
        )
    except SpecOpsError as error:
        fail(str(error))
    results["settings"] = {
        "prompts": prompts, "max_tokens": max_tokens, "plain_max_tokens": plain_max_tokens,
        "drafter": drafter, "policy": policy, "k": k, "threads": threads, "hardware": hardware,
    }  # fmt: skip
    write_results(results, out)
    typer.echo(json.dumps(results["summary"], indent=2))
    typer.echo(f"wrote {out}", err=True)


simulate_app = typer.Typer(invoke_without_command=True)  # the callback's docstring is its help
app.add_typer(simulate_app, name="simulate")


@simulate_app.callback()
def simulate(
    ctx: typer.Context,
    config: Annotated[Path, typer.Option(help="Scenario (YAML).")] = Path("configs/simulate.yaml"),
    out: Annotated[
        Path | None,
        typer.Option(
            help="Report file (results/simulate.json); with --sweep a folder (results/sim-sweep)."
        ),
    ] = None,
    sweep: Annotated[
        str | None,
        typer.Option(
            help="drafts=1,10,100: sweep the draft clients (closed-loop clients, or Poisson "
            "clients at the scenario's rate each)."
        ),
    ] = None,
    targets: Annotated[
        str | None, typer.Option(help="With --sweep: targets of each kind, e.g. 1,2,4,8.")
    ] = None,
    mlflow: Annotated[
        bool,
        typer.Option(help="Log to MLflow (a sweep: one run, one nested run per point)."),
    ] = False,
    progress: Annotated[bool, typer.Option(help="Show the sweep's progress bar.")] = True,
) -> None:
    """Run a deployment scenario through the discrete-event simulator (docs/simulator.md);
    write its report (throughput, TTFT/TPOT, queue depth, batch utilisation, goodput). With
    --sweep, run it over draft clients (and --targets): sweep.json, sweep.md, sweep.png.
    `specops simulate acceptance` estimates a drafter's acceptance from records."""
    if ctx.invoked_subcommand is not None:
        return
    import time

    from serving.errors import SpecOpsError
    from tasks.simulate.config import load_scenario
    from tasks.simulate.model import simulate as run_scenario
    from tasks.simulate.report import plot_report, summarise, write_report
    from tasks.simulate.sweep import log_sweep, parse_counts, parse_sweep, run_sweep

    if sweep is None:
        if targets is not None:
            fail("--targets goes with --sweep (e.g. --sweep drafts=1,10,100 --targets 1,2)")
        out = out or Path("results/simulate.json")
        try:
            scenario = load_scenario(config)
            started = time.perf_counter()
            report = summarise(run_scenario(scenario))
        except SpecOpsError as error:
            fail(str(error))
        report["wall_s"] = time.perf_counter() - started
        write_report(report, out)
        figure = plot_report(report, out.with_suffix(".png"))
        typer.echo(json.dumps({k: v for k, v in report.items() if not isinstance(v, dict | list)}))
        typer.echo(f"wrote {out} and {figure}", err=True)
        if mlflow:
            from registry.client import Registry

            headline = {
                key: float(value)
                for key, value in report.items()
                if isinstance(value, int | float) and not isinstance(value, bool)
            }
            try:
                run_id = Registry().log_report(
                    f"simulate-{config.stem}",
                    [out, figure],
                    metrics=headline,
                    tags={"report": "simulate", "config": str(config)},
                )
            except SpecOpsError as error:
                fail(str(error))
            typer.echo(f"logged to MLflow run {run_id}", err=True)
        return
    out = out or Path("results/sim-sweep")
    try:
        drafts = parse_sweep(sweep)
        counts = parse_counts(targets, name="--targets") if targets is not None else None
        payload = run_sweep(
            load_scenario(config), drafts, counts, out, config=str(config), progress=progress
        )
    except SpecOpsError as error:
        fail(str(error))
    typer.echo((out / "sweep.md").read_text(), nl=False)
    typer.echo(f"wrote {out / 'sweep.json'}, {out / 'sweep.md'} and {out / 'sweep.png'}", err=True)
    if mlflow:
        from registry.client import Registry

        try:
            run_id = log_sweep(Registry().log_report, payload, out)
        except SpecOpsError as error:
            fail(str(error))
        typer.echo(f"logged to MLflow run {run_id}", err=True)


@simulate_app.command("acceptance")
def simulate_acceptance(
    records: Annotated[
        list[Path],
        typer.Option(help="A capture store, a folder of JSONL parts or a file; repeatable."),
    ],
    out: Annotated[
        Path | None, typer.Option(help="Write drafters and evidence here (.yaml, else JSON).")
    ] = None,
    k: Annotated[
        int | None, typer.Option("--k", help="Draft length (default: the longest proposed).")
    ] = None,
    draft_s_per_token: Annotated[
        float, typer.Option(help="Drafting time per token on the draft device.")
    ] = 0.0,
) -> None:
    """Estimate each drafter's acceptance by position (per workload, or per path for
    records without one) from collected records; print a scenario's drafters section."""
    import yaml

    from serving.atomic import write_text_atomic
    from serving.errors import SpecOpsError
    from tasks.simulate.acceptance import drafters_section, estimate_records

    try:
        section = drafters_section(
            estimate_records(records), k=k, draft_s_per_token=draft_s_per_token
        )
    except SpecOpsError as error:
        fail(str(error))
    typer.echo(yaml.safe_dump({"drafters": section["drafters"]}, sort_keys=False), nl=False)
    for row in section["evidence"]:
        typer.echo(
            f"{row['name']}: {row['requests']} requests, {row['steps']} steps, trials by "
            f"position {row['trials']}",
            err=True,
        )
    if out is not None:
        if out.suffix in (".yaml", ".yml"):
            write_text_atomic(out, yaml.safe_dump(section, sort_keys=False))
        else:
            write_text_atomic(out, json.dumps(section, indent=2) + "\n")
        typer.echo(f"wrote {out}", err=True)


@simulate_app.command("trace")
def simulate_trace(
    records: Annotated[
        list[Path],
        typer.Option(help="A capture store, a folder of JSONL parts or a file (repeatable)."),
    ],
    workload: Annotated[str | None, typer.Option(help="Only this workload's records.")] = None,
    hardware: Annotated[str | None, typer.Option(help="Only this target's records.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write the arrivals section here.")] = None,
) -> None:
    """An `arrivals:` section replaying captured traffic request by request (timestamps,
    prompt and output lengths), to paste into a scenario (docs/simulator.md)."""
    import yaml

    from serving.atomic import write_text_atomic
    from serving.errors import SpecOpsError
    from tasks.simulate.trace import trace_from_records

    try:
        arrivals = trace_from_records(records, workload=workload, hardware=hardware)
    except SpecOpsError as error:
        fail(str(error))
    text = yaml.safe_dump({"arrivals": arrivals}, sort_keys=False, default_flow_style=None)
    typer.echo(text, nl=False)
    span = arrivals["timestamps"][-1]
    typer.echo(f"{len(arrivals['timestamps'])} requests over {span:.1f} s", err=True)
    if out is not None:
        write_text_atomic(out, text)
        typer.echo(f"wrote {out}", err=True)


@simulate_app.command("calibrate")
def simulate_calibrate(
    bench: Annotated[Path, typer.Option(help="A `specops distributed bench` results file.")] = Path(
        "results/distributed.json"
    ),
    profile: Annotated[
        Path, typer.Option(help="A `specops profile --batch` result at the server's threads.")
    ] = Path("docs/profile-batch-1thread.json"),
    window_ms: Annotated[float, typer.Option(help="The server's batching window.")] = 2.0,
    out: Annotated[Path, typer.Option(help="Results file (.md and .png beside it).")] = Path(
        "results/calibration.json"
    ),
    mlflow: Annotated[bool, typer.Option(help="Log the comparison as an MLflow run.")] = False,
) -> None:
    """Predict every measured point of a distributed bench with the simulator, configured
    from the profile, and report the errors (docs/simulator.md)."""
    from serving.errors import SpecOpsError
    from tasks.simulate.calibrate import CalibrationSettings, calibrate, write_calibration

    try:
        measured = json.loads(bench.read_text())
    except (OSError, ValueError) as error:
        fail(f"cannot read the bench results {str(bench)!r}: {error}")
    try:
        _fill_prompt_lengths(measured)
        result = calibrate(
            measured,
            CalibrationSettings(profile=profile, window_s=window_ms / 1000.0),
            progress=lambda label: typer.echo(f"simulating {label}", err=True),
        )
    except SpecOpsError as error:
        fail(str(error))
    result["bench"] = str(bench)
    paths = write_calibration(result, out)
    typer.echo(paths["table"].read_text())
    if mlflow:
        from registry.client import Registry

        summary = result["summary"]
        run_id = Registry().log_report(
            "simulator-calibration",
            list(paths.values()),
            metrics={k: float(v) for k, v in summary.items()},
            tags={"report": "simulator-calibration", "bench": str(bench)},
        )
        typer.echo(f"logged MLflow run {run_id}", err=True)
    typer.echo("wrote " + ", ".join(str(p) for p in paths.values()), err=True)


def _fill_prompt_lengths(measured: dict) -> None:
    """Results written before the bench recorded prompt lengths: rebuild them from its
    settings (the same seeded workload, encoded the same way)."""
    requests = [r for p in measured.get("points", []) for r in p.get("per_request", [])]
    if all("prompt_tokens" in r for r in requests):
        return
    from transformers import AutoTokenizer

    from serving.loader import encode_prompt
    from serving.models.real import real_model_dir
    from tasks.data.traffic import build_workload

    settings = measured["settings"]
    tokenizer = AutoTokenizer.from_pretrained(real_model_dir(progress=False))
    count = max(max(settings["requests"], 2 * s) for s in settings["sessions"])
    prompts = build_workload(settings["workload"], min(count, 64), seed=settings["seed"])
    lengths = [len(encode_prompt(tokenizer, p.user_text)) for p in prompts]
    for request in requests:
        request["prompt_tokens"] = lengths[request["prompt"] % len(lengths)]


@app.command()
def bench(
    config: Annotated[Path, typer.Option(help="Bench config (YAML).")] = Path("configs/bench.yaml"),
    prompts: Annotated[int | None, typer.Option(help="Prompts per workload.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Token budget per prompt.")] = None,
    threads: Annotated[int | None, typer.Option(help="torch threads (recorded).")] = None,
    workloads: Annotated[str | None, typer.Option(help="Comma-separated workloads.")] = None,
    methods: Annotated[str | None, typer.Option(help="Comma-separated method names.")] = None,
    seed: Annotated[int | None, typer.Option(help="Prompt-selection seed.")] = None,
    out: Annotated[Path, typer.Option(help="Folder for bench.json and bench.png.")] = Path(
        "results"
    ),
) -> None:
    """Benchmark specops against HF greedy, HF assisted generation, HF prompt lookup and
    llama.cpp (plain and prompt lookup, when .venv-llamacpp exists)."""
    from serving.errors import SpecOpsError
    from tasks.bench.bench import format_table, load_bench_config, run_bench

    try:
        overrides: dict[str, object] = {
            "prompts_per_workload": prompts,
            "max_new_tokens": max_new_tokens,
            "threads": threads,
            "seed": seed,
            "workloads": workloads.split(",") if workloads else None,
        }
        settings = load_bench_config(config, **overrides)
        if methods:
            wanted = methods.split(",")
            unknown = sorted(set(wanted) - {m.name for m in settings.methods})
            if unknown:
                fail(
                    f"unknown methods {unknown}; the config has "
                    f"{[m.name for m in settings.methods]}"
                )
            settings.methods = [
                m for m in settings.methods if m.name in wanted or m.name == "hf-greedy"
            ]
        results = run_bench(settings, out_dir=out)
    except SpecOpsError as error:
        fail(str(error))
    typer.echo(format_table(results["summary"], results["skipped"]))
    bandwidth = results["environment"]["memory_bandwidth"]["gb_per_s"]
    typer.echo(
        f"threads={results['environment']['threads']}  memory bandwidth={bandwidth:.1f} GB/s  "
        f"results: {out / 'bench.json'}  plot: {out / 'bench.png'}"
    )


@app.command()
def profile(
    hardware: Annotated[
        str,
        typer.Option(
            help="Hardware target to measure on: its device, dtype, kernels and threads "
            "(configs/hardware.yaml). Its verify curve need not exist yet."
        ),
    ] = "cpu",
    threads: Annotated[
        int | None, typer.Option(help="torch threads (recorded); default: the target's.")
    ] = None,
    max_n: Annotated[int, typer.Option(help="Largest block to time (not with --batch).")] = 16,
    context: Annotated[
        int | None,
        typer.Option(
            help="Tokens already in the KV cache; default 256, or 200 with --batch (each "
            "sequence's within ±25%)."
        ),
    ] = None,
    repeats: Annotated[int, typer.Option(help="Timings per size (medians kept).")] = 15,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Results file; default results/profile.json, or results/profile-batch.json "
            "with --batch (its plot beside it as .png)."
        ),
    ] = None,
    kernels: Annotated[
        str | None,
        typer.Option(help="onednn | int8 | int4 (CPU) | stock; default: the target's."),
    ] = None,
    batch: Annotated[
        bool,
        typer.Option(
            "--batch",
            help="Measure packed passes instead: n rows shared by B sequences, each with its "
            "own cache, and print the batch_curve configs/hardware.yaml takes.",
        ),
    ] = False,
) -> None:
    """Measure target-pass cost by block size, and first-N-layer draft costs, on a hardware
    target, and print its verify curve as configs/hardware.yaml takes it (with --batch: the
    cost of packed passes over several sequences, and its batch curve)."""
    from serving.atomic import write_json_atomic
    from serving.errors import SpecOpsError
    from tasks.bench.profile import (
        batch_yaml,
        curve_yaml,
        plot_batch,
        profile_batch_hardware,
        profile_hardware,
    )

    if batch:
        out = out or Path("results/profile-batch.json")
        try:
            batched = profile_batch_hardware(
                hardware,
                kernels=kernels,
                threads=threads,
                context=context if context is not None else 200,
                repeats=repeats,
            )
        except SpecOpsError as error:
            fail(str(error))
        write_json_atomic(out, {"hardware": hardware, **batched})
        plot = plot_batch(
            batched,
            out.with_suffix(".png"),
            title=f"packed pass cost on {hardware} ({batched['threads']} threads)",
        )
        typer.echo(
            f"{hardware}: {batched['device_name']} ({batched['device']}, {batched['dtype']}, "
            f"{batched['threads']} threads), contexts {batched['context']}"
        )
        one_row = next(c for c in batched["table"] if (c["rows"], c["sequences"]) == (1, 1))
        typer.echo(f"packed pass over 1 row of 1 sequence: {one_row['pass_s'] * 1000:.1f} ms")
        typer.echo("cost by rows n (rows), sequences B (columns), relative to that pass:")
        counts = sorted({c["sequences"] for c in batched["table"]})
        typer.echo("  rows " + "".join(f"{f'B={b}':>8}" for b in counts))
        for n in sorted({c["rows"] for c in batched["table"]}):
            costs = {c["sequences"]: c["cost"] for c in batched["table"] if c["rows"] == n}
            typer.echo(
                f"  {n:>4} "
                + "".join(f"{costs[b]:>8.2f}" if b in costs else " " * 8 for b in counts)
            )
        typer.echo(
            f"for configs/hardware.yaml, under targets.{hardware} (the most sequences, "
            "made non-decreasing):"
        )
        typer.echo("    " + batch_yaml(batched["batch_curve"]))
        typer.echo(f"results: {out}, plot: {plot}")
        return
    out = out or Path("results/profile.json")
    try:
        result = profile_hardware(
            hardware,
            kernels=kernels,
            threads=threads,
            max_n=max_n,
            context=context if context is not None else 256,
            repeats=repeats,
        )
    except SpecOpsError as error:
        fail(str(error))
    write_json_atomic(out, {"hardware": hardware, **result})
    typer.echo(
        f"{hardware}: {result['device_name']} ({result['device']}, {result['dtype']}, "
        f"{result['threads']} threads)"
    )
    typer.echo(f"verify cost by block size n=1..{max_n} (relative to n=1):")
    typer.echo("  " + ", ".join(f"{c:.2f}" for c in result["verify_curve"]))
    typer.echo(f"one-token target pass: {result['target_pass_s'][1] * 1000:.1f} ms")
    typer.echo(
        "draft cost per token (relative to a target pass): "
        + ", ".join(f"{name}={cost:.2f}" for name, cost in result["draft_cost"].items())
    )
    typer.echo(f"for configs/hardware.yaml, under targets.{hardware} (made non-decreasing):")
    typer.echo("    " + curve_yaml(result["config_curve"]))
    typer.echo(f"results: {out}")


@app.command()
def serve(
    config: Annotated[Path, typer.Option(help="Serving config (YAML).")] = Path(
        "configs/serving.yaml"
    ),
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8000).")] = None,
    target: Annotated[str | None, typer.Option(help="smollm2 or a local model folder.")] = None,
    hardware: Annotated[str | None, typer.Option(help="Hardware target.")] = None,
    threads: Annotated[int | None, typer.Option(help="torch threads per decode worker.")] = None,
    drafter: Annotated[
        str | None, typer.Option(help="Serve this drafter spec (a static champion).")
    ] = None,
    champion: Annotated[
        Path | None,
        typer.Option(help="Serve the draft package a pointer file names; hot-swap on change."),
    ] = None,
    registry: Annotated[
        bool, typer.Option("--registry", help="Serve the MLflow champion of the hardware target.")
    ] = False,
    capture_share: Annotated[
        float | None, typer.Option(help="Share of requests captured into the store.")
    ] = None,
    store: Annotated[Path | None, typer.Option(help="Capture store folder.")] = None,
    queue_size: Annotated[int | None, typer.Option(help="Waiting requests before 429.")] = None,
    max_active: Annotated[int | None, typer.Option(help="Requests decoded concurrently.")] = None,
    workers: Annotated[int | None, typer.Option(help="Decode threads.")] = None,
    api_key_file: Annotated[
        Path | None,
        typer.Option(
            help="API keys, one per line (mode 600); also read: $SPECOPS_API_KEYS. Keys are "
            "never taken as command-line values."
        ),
    ] = None,
    allow_unauthenticated: Annotated[
        bool,
        typer.Option(
            "--allow-unauthenticated",
            help="Serve beyond loopback with no API key (refused otherwise).",
        ),
    ] = False,
) -> None:
    """Serve the target with its champion draft: an OpenAI-compatible HTTP endpoint."""
    import logging

    import uvicorn

    from serving.errors import SpecOpsError
    from serving.security import logs
    from serving.server.app import create_app
    from serving.server.config import load_server_config
    from serving.server.state import build_state, server_keys

    if sum([drafter is not None, champion is not None, registry]) > 1:
        fail("give at most one of --drafter, --champion and --registry")
    source = "static" if drafter else "local" if champion else "registry" if registry else None
    try:
        settings = load_server_config(
            config,
            **{
                "host": host,
                "port": port,
                "target": target,
                "hardware": hardware,
                "threads": threads,
                "champion.source": source,
                "champion.drafter": drafter,
                "champion.path": str(champion) if champion else None,
                "capture.share": capture_share,
                "capture.store": str(store) if store else None,
                "limits.queue_size": queue_size,
                "limits.max_active": max_active,
                "limits.workers": workers,
                "security.api_key_file": str(api_key_file) if api_key_file else None,
                "security.allow_unauthenticated": allow_unauthenticated or None,
            },
        )
        keys = server_keys(settings)  # before the model loads: a bad key file fails fast
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        logs.install(keys.secrets)
        state = build_state(settings, api_keys=keys)
    except SpecOpsError as error:
        fail(str(error))
    access = f"API keys: {len(keys.digests)}" if keys.enabled else "no API key (open)"
    typer.echo(
        f"serving {settings.model_name} on http://{settings.host}:{settings.port}/v1 "
        f"(hardware {settings.hardware}, draft {state.watcher.current.ref.version}, {access})",
        err=True,
    )
    # uvicorn's loggers go through the root handlers (log_config=None), so the secret filter
    # masks them too.
    logging.getLogger("uvicorn").setLevel(logging.WARNING)
    uvicorn.run(
        create_app(state),
        host=settings.host,
        port=settings.port,
        log_config=None,
        log_level="warning",
        timeout_graceful_shutdown=10,
    )


@app.command()
def loadtest(
    url: Annotated[
        str | None, typer.Option(help="A running server (loopback); default: start one.")
    ] = None,
    clients: Annotated[
        str, typer.Option(help="Concurrency levels, a comma list; measured one after the other.")
    ] = "1,2,4,8",
    requests: Annotated[int, typer.Option(help="Requests per level.")] = 16,
    max_tokens: Annotated[int, typer.Option(help="max_tokens per request.")] = 64,
    temperature: Annotated[
        float, typer.Option(help="Sampling temperature; at 0 the levels' outputs are compared.")
    ] = 0.0,
    skeleton: Annotated[
        bool, typer.Option("--skeleton", help="Ask for skeleton-of-thought decoding per request.")
    ] = False,
    workload: Annotated[str, typer.Option(help="Prompts: a workload's held-out split.")] = (
        "sharegpt"
    ),
    drafter: Annotated[
        str | None, typer.Option(help="Per-request drafter (default: the champion).")
    ] = None,
    serve_args: Annotated[
        str, typer.Option(help="Extra `specops serve` options when starting the server.")
    ] = "",
    out: Annotated[
        Path, typer.Option(help="Results file; the table (.md) and plot (.png) go beside it.")
    ] = Path("results/loadtest.json"),
) -> None:
    """Load-test a server on loopback at several concurrency levels with the official openai
    client; write a results file, a table and a plot."""
    import asyncio
    import shlex

    from serving.errors import SpecOpsError
    from tasks.ops.loadtest import (
        LoadTestSettings,
        check_levels,
        markdown_table,
        parse_levels,
        run_load_sweep,
        write_report,
    )
    from tasks.ops.server_process import ServerProcess

    settings = LoadTestSettings(
        requests=requests,
        max_tokens=max_tokens,
        temperature=temperature,
        workload=workload,
        drafter=drafter,
        skeleton=skeleton,
    )
    server = None
    try:
        levels = parse_levels(clients)
        settings.check()
        check_levels(levels, requests)
        if url is None:
            out.parent.mkdir(parents=True, exist_ok=True)
            log_path = out.with_suffix(".server.log")
            typer.echo(f"starting a server (log: {log_path}) ...", err=True)
            server = ServerProcess(shlex.split(serve_args), log_path=log_path).start()
            url = server.url
        settings.url = url
        results = asyncio.run(run_load_sweep(settings, levels))
    except SpecOpsError as error:
        fail(str(error))
    finally:
        if server is not None:
            server.stop()
    results["serve_args"] = serve_args if server is not None else None
    written = write_report(results, out)
    equal = results["outputs_equal"]
    typer.echo(
        markdown_table(results)
        + "\ngreedy outputs equal at every level: "
        + ("n/a (temperature > 0)" if equal is None else "yes" if equal else "NO")
        + f"\nresults: {written['json']}, {written['table']}, {written['plot']}"
    )


@app.command("model-path")
def model_path() -> None:
    """Convert the shipped SmolLM2-135M-Instruct once (cached) and print its folder."""
    from serving.models.real import real_model_dir

    typer.echo(str(real_model_dir()))


if __name__ == "__main__":
    app()
