"""Back here, one command takes a GPU run kit's ``results/`` folder (``specops gpu ingest``):

1. the measured verify and batch curves go into ``configs/hardware.yaml`` under the kit's
   target, with their provenance (GPU, driver, CUDA, torch, transformers, repeats);
2. the challengers trained there are registered (once: a second ingest of the same
   results finds them by key), with the kit's lineage, and the evaluation is logged as
   ``specops registry log-evaluation --promote`` logs one: the gates decide;
3. ``docs/gpu/<target>.md`` (and its bench plot, ``measurements/gpu/<target>-bench.png``):
   the champion, its speedup over plain decoding and over transformers' static-cache
   compiled ``generate``, its mean accepted length, and how the champion compares with
   ``cpu``'s.

A step that did not run leaves its part out, said in the summary; nothing is made up.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving.errors import BadInputError
from serving.hardware import HARDWARE_CONFIG
from serving.paths import PROJECT_ROOT
from tasks.gpu.hardware_yaml import set_target_key

DOCS = PROJECT_ROOT / "docs" / "gpu"
# The bench plot a page shows: with the other result files, outside docs/.
PLOTS = PROJECT_ROOT / "measurements" / "gpu"


@dataclass
class Ingested:
    hardware: str
    curves: list[str] = field(default_factory=list)
    registered: dict[str, str] = field(default_factory=dict)  # contender -> label
    promoted: str | None = None
    champion: str | None = None
    gates: dict[str, str] = field(default_factory=dict)
    doc: Path | None = None
    missing: list[str] = field(default_factory=list)


def _read(results: Path, name: str) -> Any:
    path = results / name
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise BadInputError(f"{path} is not valid JSON: {error}") from None


def _provenance_line(provenance: dict | None, repeats: int | None) -> str:
    machine = (provenance or {}).get("machine", {})
    smi = machine.get("nvidia_smi")
    gpu = (machine.get("gpu") or {}).get("name") or "no GPU"
    driver = smi.get("driver_version") if isinstance(smi, dict) else None
    versions = machine.get("versions", {})
    parts = [
        gpu,
        f"driver {driver}" if driver else None,
        f"CUDA {machine['cuda']}" if machine.get("cuda") else None,
        f"torch {versions.get('torch')}",
        f"transformers {versions.get('transformers')}",
        f"{repeats} repeats" if repeats else None,
    ]
    return ", ".join(p for p in parts if p)


def write_curves(results: Path, hardware_config: Path, provenance: dict | None) -> list[str]:
    written = []
    profile = _read(results, "profile.json")
    if profile is not None:
        line = _provenance_line(provenance, profile.get("repeats"))
        comment = [
            f"Measured by the GPU run kit (specops gpu ingest): {line}; one-token pass "
            f"{float(profile['target_pass_s']['1']) * 1000:.2f} ms, made non-decreasing."
        ]
        set_target_key(
            hardware_config,
            profile["hardware"],
            "verify_curve",
            profile["config_curve"],
            comment,
        )
        written.append("verify_curve")
    batched = _read(results, "profile-batch.json")
    if batched is not None:
        comment = [
            f"Measured by the GPU run kit: {_provenance_line(provenance, batched.get('repeats'))}."
        ]
        curve = [list(point) for point in batched["batch_curve"]]
        set_target_key(hardware_config, batched["hardware"], "batch_curve", curve, comment)
        written.append("batch_curve")
    return written


def _register_trained(
    registry, results: Path, run: dict, lineage: dict[str, str]
) -> dict[str, str]:
    """Label every contender of the run: the bundle's have theirs; the trained ones are
    registered here (found again by key on a second ingest)."""
    trained = _read(results, "trained.json") or {}
    labels: dict[str, str] = {}
    for name, label in run["labels"].items():
        if label is not None:
            labels[name] = label
            continue
        family = name.removeprefix("trained-")
        entry = trained.get(family) or {}
        package = results / str(entry.get("package", f"trained/{family}"))
        if not (package / "draft.json").is_file():
            raise BadInputError(
                f"{results}: contender {name} was evaluated, but its package {package} did "
                "not come back: copy the results folder whole"
            )
        key = f"{run['hardware']}/gpu-kit/{run['produced_by']['started']}/{family}"
        found = registry.find_version(registry.model_name(family), family, run_key=key)
        if found is None:
            params = {k: v for k, v in (entry.get("params") or {}).items() if v is not None}
            found = registry.log_draft(
                package,
                family=family,
                params=params,
                tags={**lineage, "run_key": key, "trained_on": run["produced_by"]["device"]},
            )
        labels[name] = found.label
    return labels


def log_run(results: Path, *, promote: bool, registry=None) -> tuple[dict[str, str], Any]:
    """The evaluation run there, as an evaluation file (written to ``results``), logged and
    gated as ``specops registry log-evaluation`` does."""
    from registry.client import Registry
    from serving.hardware import hardware_target
    from serving.models.real import cache_root
    from tasks.evaluate.evaluation_file import read_evaluation_file, write_evaluation_file
    from tasks.loop.evaluation_steps import decide

    run = _read(results, "evaluation-run.json")
    if run is None:
        raise BadInputError(
            f"{results} holds no evaluation-run.json: the evaluate step did not run"
        )
    registry = registry or Registry()
    provenance = _read(results, "provenance.json") or {}
    commit = (provenance.get("kit") or {}).get("commit", "unknown")
    labels = _register_trained(registry, results, run, {"git_commit": commit})
    produced_by = {k: str(v) for k, v in run["produced_by"].items()}
    path = results / "evaluation.json"
    write_evaluation_file(
        path,
        {
            "format": 1,
            "hardware": run["hardware"],
            "produced_by": produced_by,
            "prompts": run["prompts"],
            "max_new_tokens": run["max_new_tokens"],
            "contenders": labels,
            "report": run["report"],
        },
    )
    evaluation = read_evaluation_file(path)
    drafts = {name: registry.resolve(label) for name, label in evaluation.contenders.items()}
    params = {
        "prompts": evaluation.prompts,
        "max_new_tokens": evaluation.max_new_tokens,
        "source": "gpu-kit",
        **{f"produced_by.{k}": v for k, v in evaluation.produced_by.items()},
    }
    decision = decide(
        registry,
        evaluation.report,
        drafts,
        hardware=hardware_target(evaluation.hardware),  # the file names a known target
        cache=cache_root() / "registry",
        promote=promote,
        params=params,
        artifacts=[path],
    )
    return labels, decision


def _bench_rows(results: Path) -> dict[str, dict]:
    bench = _read(results, "bench/bench.json")
    if bench is None:
        return {}
    return {row["method"]: row for row in bench["summary"] if row["workload"] == "all"}


def _vllm_lines(vllm: dict | None) -> list[str]:
    if vllm is None:
        return ["", "vLLM: the vllm step did not run."]
    if not vllm.get("results"):
        reasons = vllm.get("unsupported") or {}
        why = vllm.get("reason") or "; ".join(f"{k}: {v}" for k, v in reasons.items())
        return ["", f"vLLM: nothing evaluated. {why}"]
    lines = [
        "",
        f"On `{vllm['hardware']}` (vLLM {vllm['vllm']}, k = {vllm['k']}):",
        "",
        "| contender | speedup over vLLM plain | exact |",
        "|---|---:|---|",
    ]
    for name, result in vllm["results"].items():
        if name != "plain":
            lines.append(f"| {name} | {result.get('speedup') or 0:.2f}× | {result.get('exact')} |")
    for name, reason in (vllm.get("unsupported") or {}).items():
        lines.append(f"- {name} not run on vLLM: {reason}")
    return lines


def _evaluation_lines(run: dict, ingested: Ingested) -> list[str]:
    """The evaluation's table: each registered contender's speedup, accepted length and
    losslessness."""
    report = run["report"]["results"]
    lines = [
        "",
        "| contender | version | speedup over plain | mean accepted length | lossless |",
        "|---|---|---:|---:|---|",
    ]
    for name, label in ingested.registered.items():
        r = report[name]
        lines.append(
            f"| {name} | {label} | {r.get('speedup') or 0:.2f}× | "
            f"{r.get('mean_accepted_length') or 0:.2f} | {r.get('lossless')} |"
        )
    return lines


def _bench_lines(rows: dict[str, dict], shown: str) -> list[str]:
    """The bench's table (tokens/s over HF greedy and over compiled HF static) and its plot
    at ``shown`` (relative to the page)."""
    lines = [
        "",
        "Bench (same prompts, greedy, interleaved): tokens/s and ratios",
        "",
        "| method | tok/s | × hf-greedy | × hf-static (compiled on a GPU) | identical |",
        "|---|---:|---:|---:|---|",
    ]
    static = (rows.get("hf-static") or {}).get("tokens_per_s")
    for method, row in rows.items():
        ratio = f"{row['tokens_per_s'] / static:.2f}" if static else "n/a"
        lines.append(
            f"| {method} | {row['tokens_per_s']:.1f} | {row.get('speedup') or 0:.2f} "
            f"| {ratio} | {row.get('identical')} |"
        )
    return [*lines, "", f"![bench]({shown})"]


def _cpu_champion_lines(champion: str | None, cpu_champion: str | None) -> list[str]:
    """How this target's champion compares with ``cpu``'s: the same family or not."""
    same = (champion or "").split("/")[0] == (cpu_champion or "").split("/")[0]
    return [
        "",
        f"`cpu`'s champion: {cpu_champion or 'none'}. "
        + (
            "The same family serves both targets."
            if same
            else "The families differ: each target's gates judged its own measured speed "
            "(the table above for this one)."
        ),
    ]


def render_doc(
    results: Path,
    docs: Path,
    ingested: Ingested,
    cpu_champion: str | None,
    plots: Path = PLOTS,
) -> Path:
    """``docs/gpu/<target>.md`` from what the results hold, and its bench plot in
    ``plots`` (``measurements/gpu/``)."""
    hardware = ingested.hardware
    provenance = _read(results, "provenance.json") or {}
    profile = _read(results, "profile.json")
    run = _read(results, "evaluation-run.json")
    steps = (_read(results, "steps.json") or {}).get("steps", {})
    rows = _bench_rows(results)
    lines = [f"# `{hardware}`: what the GPU run kit measured", ""]
    lines.append(f"Machine: {_provenance_line(provenance, profile and profile.get('repeats'))}.")
    lines.append(
        f"Kit commit: `{(provenance.get('kit') or {}).get('commit', 'unknown')}`. "
        "Written by `specops gpu ingest`; the numbers are in the results folder's "
        "JSON files."
    )
    lines += ["", "| step | outcome | seconds |", "|---|---|---:|"]
    lines += [
        f"| {name} | {s['status']} | {s.get('seconds', 0):.0f} |" for name, s in steps.items()
    ]
    if profile is not None:
        curve = profile["config_curve"]
        lines += [
            "",
            f"Verify curve (pass over n tokens ÷ one-token pass, n = 1..{len(curve)}): "
            f"`{curve}`; one-token pass "
            f"{float(profile['target_pass_s']['1']) * 1000:.2f} ms.",
        ]
    if run is not None:
        lines += _evaluation_lines(run, ingested)
    champion = ingested.promoted or ingested.champion
    lines += [
        "",
        f"Champion on `{hardware}`: **{champion or 'none (plain decoding)'}**"
        + (" (promoted by this ingest)." if ingested.promoted else "."),
    ]
    for label, reason in ingested.gates.items():
        lines.append(f"- gate {label}: {reason}")
    if rows:
        shown = Path(os.path.relpath(plots / f"{hardware}-bench.png", docs)).as_posix()
        lines += _bench_lines(rows, shown)
    if champion is not None or cpu_champion is not None:
        lines += _cpu_champion_lines(champion, cpu_champion)
    lines += _vllm_lines(_read(results, "vllm.json"))
    docs.mkdir(parents=True, exist_ok=True)
    path = docs / f"{hardware}.md"
    path.write_text("\n".join(lines) + "\n")
    if rows:
        from tasks.bench.bench import plot

        plots.mkdir(parents=True, exist_ok=True)
        plot(
            list(_read(results, "bench/bench.json")["summary"]),
            plots / f"{hardware}-bench.png",
            hardware=hardware,
        )
    return path


def ingest(
    results: str | Path,
    *,
    hardware_config: Path = HARDWARE_CONFIG,
    docs: Path = DOCS,
    plots: Path = PLOTS,
    promote: bool = True,
    registry=None,
) -> Ingested:
    from registry.client import Registry

    results = Path(results)
    provenance = _read(results, "provenance.json")
    ledger = _read(results, "steps.json")
    if provenance is None or ledger is None:
        raise BadInputError(
            f"{results} is not a GPU run kit's results folder (no provenance.json or "
            "steps.json): run `bash run.sh measure` there first"
        )
    ingested = Ingested(hardware=ledger["hardware"])
    ingested.curves = write_curves(results, Path(hardware_config), provenance)
    registry = registry or Registry()
    if (results / "evaluation-run.json").is_file():
        ingested.registered, decision = log_run(results, promote=promote, registry=registry)
        ingested.promoted = decision.promoted
        ingested.champion = decision.champion
        ingested.gates = {label: result.reason for label, result in decision.gates.items()}
    else:
        ingested.missing.append("evaluation (the evaluate step did not run)")
    cpu = registry.champion("cpu")
    champion = cpu.label if cpu else None
    ingested.doc = render_doc(results, Path(docs), ingested, champion, Path(plots))
    return ingested
