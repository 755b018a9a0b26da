"""``specops simulate``: deployment scenarios through the discrete-event simulator, and the
sections a scenario takes from measured data (:mod:`tasks.simulate`, docs/simulator.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from specops.exit import fail, failing

if TYPE_CHECKING:
    from tasks.simulate.report import ReportLogger

simulate_app = typer.Typer(invoke_without_command=True)  # the callback's docstring is its help

Records = Annotated[
    list[Path],
    typer.Option(help="A capture store, a folder of JSONL parts or a file; repeatable."),
]


def _log_report() -> ReportLogger:
    """The registry's report logger (one MLflow run with files and metrics)."""
    from registry.client import Registry

    return Registry().log_report


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

    from tasks.simulate.config import load_scenario
    from tasks.simulate.model import simulate as run_scenario
    from tasks.simulate.report import log_scenario, plot_report, summarise, write_report
    from tasks.simulate.sweep import log_sweep, parse_counts, parse_sweep, run_sweep

    if sweep is None:
        if targets is not None:
            fail("--targets goes with --sweep (e.g. --sweep drafts=1,10,100 --targets 1,2)")
        out = out or Path("results/simulate.json")
        with failing():
            scenario = load_scenario(config)
            started = time.perf_counter()
            report = summarise(run_scenario(scenario))
        report["wall_s"] = time.perf_counter() - started
        write_report(report, out)
        figure = plot_report(report, out.with_suffix(".png"))
        typer.echo(json.dumps({k: v for k, v in report.items() if not isinstance(v, dict | list)}))
        typer.echo(f"wrote {out} and {figure}", err=True)
        if mlflow:
            with failing():
                run_id = log_scenario(_log_report(), report, [out, figure], config)
            typer.echo(f"logged to MLflow run {run_id}", err=True)
        return
    out = out or Path("results/sim-sweep")
    with failing():
        drafts = parse_sweep(sweep)
        counts = parse_counts(targets, name="--targets") if targets is not None else None
        payload = run_sweep(
            load_scenario(config), drafts, counts, out, config=str(config), progress=progress
        )
    typer.echo((out / "sweep.md").read_text(), nl=False)
    typer.echo(f"wrote {out / 'sweep.json'}, {out / 'sweep.md'} and {out / 'sweep.png'}", err=True)
    if mlflow:
        with failing():
            run_id = log_sweep(_log_report(), payload, out)
        typer.echo(f"logged to MLflow run {run_id}", err=True)


@simulate_app.command("acceptance")
def acceptance(
    records: Records,
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
    from tasks.simulate.acceptance import drafters_section, estimate_records

    with failing():
        section = drafters_section(
            estimate_records(records), k=k, draft_s_per_token=draft_s_per_token
        )
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
def trace(
    records: Records,
    workload: Annotated[str | None, typer.Option(help="Only this workload's records.")] = None,
    hardware: Annotated[str | None, typer.Option(help="Only this target's records.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write the arrivals section here.")] = None,
) -> None:
    """An `arrivals:` section replaying captured traffic request by request (timestamps,
    prompt and output lengths), to paste into a scenario (docs/simulator.md)."""
    import yaml

    from serving.atomic import write_text_atomic
    from tasks.simulate.trace import trace_from_records

    with failing():
        arrivals = trace_from_records(records, workload=workload, hardware_name=hardware)
    text = yaml.safe_dump({"arrivals": arrivals}, sort_keys=False, default_flow_style=None)
    typer.echo(text, nl=False)
    span = arrivals["timestamps"][-1]
    typer.echo(f"{len(arrivals['timestamps'])} requests over {span:.1f} s", err=True)
    if out is not None:
        write_text_atomic(out, text)
        typer.echo(f"wrote {out}", err=True)


@simulate_app.command("calibrate")
def calibrate(
    bench: Annotated[Path, typer.Option(help="A `specops distributed bench` results file.")] = Path(
        "results/distributed.json"
    ),
    profile: Annotated[
        Path, typer.Option(help="A `specops profile --batch` result at the server's threads.")
    ] = Path("measurements/profile-batch-1thread.json"),
    window_ms: Annotated[float, typer.Option(help="The server's batching window.")] = 2.0,
    out: Annotated[Path, typer.Option(help="Results file (.md and .png beside it).")] = Path(
        "results/calibration.json"
    ),
    mlflow: Annotated[bool, typer.Option(help="Log the comparison as an MLflow run.")] = False,
) -> None:
    """Predict every measured point of a distributed bench with the simulator, configured
    from the profile, and report the errors (docs/simulator.md)."""
    from tasks.simulate.calibrate import (
        CalibrationSettings,
        log_calibration,
        write_calibration,
    )
    from tasks.simulate.calibrate import calibrate as run_calibration
    from tasks.simulate.prompt_lengths import fill_prompt_lengths

    try:
        measured = json.loads(bench.read_text())
    except (OSError, ValueError) as error:
        fail(f"cannot read the bench results {str(bench)!r}: {error}")
    with failing():
        fill_prompt_lengths(measured)
        result = run_calibration(
            measured,
            CalibrationSettings(profile=profile, window_s=window_ms / 1000.0),
            progress=lambda label: typer.echo(f"simulating {label}", err=True),
        )
    result["bench"] = str(bench)
    paths = write_calibration(result, out)
    typer.echo(paths["table"].read_text())
    if mlflow:
        with failing():
            run_id = log_calibration(_log_report(), result, paths, bench)
        typer.echo(f"logged MLflow run {run_id}", err=True)
    typer.echo("wrote " + ", ".join(str(p) for p in paths.values()), err=True)
