"""``specops train-draft`` and ``specops eval-draft``: train a draft package, evaluate one.

Registered on the main app by :func:`register_draft_commands`. Thin: options are checked
(configs built and validated) before any model loads; the work is in :mod:`tasks.train.distill`,
:mod:`tasks.train.train_head`, :mod:`tasks.train.suffix_index` and :mod:`tasks.evaluate.evaluate`.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from serving.defaults import DEFAULT_POLICY, DEFAULT_TARGET
from serving.hardware import DEFAULT_HARDWARE
from specops.exit import fail, failing
from specops.load import load_engine_target
from specops.options import POLICY_NAMES, Hardware, Target, Threads

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from serving.engine.drafters.package import DraftManifest
    from serving.target import LoadedTarget
    from tasks.train.distill import DistillConfig
    from tasks.train.teacher_build import TeacherReport
    from tasks.train.train_head import TrainHeadConfig

DRAFT_KINDS = ("head", "lora", "full", "suffix", "ngram")


def register_draft_commands(app: typer.Typer) -> None:
    """Add ``train-draft`` and ``eval-draft`` to ``app``."""
    app.command("train-draft")(train_draft)
    app.command("eval-draft")(eval_draft)


def _manifest(kind: str, k: int, policy: str, drafter: str, description: str = "") -> DraftManifest:
    """The package's ``draft.json`` (``drafter`` package-relative), its policy and k checked."""
    from serving.engine.drafters.package import DraftManifest
    from serving.engine.policy import check_k, check_policy

    check_policy(policy)
    check_k(k)
    return DraftManifest(drafter=drafter, policy=policy, k=k, family=kind, description=description)


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def train_draft(
    kind: Annotated[str, typer.Option(help="head | lora | full | suffix | ngram.")],
    out: Annotated[Path, typer.Option(help="The draft package folder to write.")],
    target: Target = DEFAULT_TARGET,
    teacher: Annotated[
        Path, typer.Option(help="Teacher cache (head/lora/full): the target's own responses.")
    ] = Path("results/teacher/train"),
    build_teacher: Annotated[
        int | None,
        typer.Option(help="First build (or resume) the teacher cache from N ShareGPT prompts."),
    ] = None,
    teacher_new_tokens: Annotated[
        int, typer.Option(help="Answer length when building the teacher cache.")
    ] = 64,
    max_prompt_tokens: Annotated[
        int, typer.Option(help="Longest prompt when building the teacher cache.")
    ] = 256,
    work_dir: Annotated[
        Path | None, typer.Option(help="Checkpoints and outputs (default: OUT.work).")
    ] = None,
    layers: Annotated[
        int, typer.Option(help="lora/full: draft = the target's first N layers.")
    ] = 4,
    draft_model: Annotated[
        Path | None, typer.Option(help="lora/full: train this local causal LM instead.")
    ] = None,
    loss: Annotated[str, typer.Option(help="lora/full: kl (top-k) | ce (greedy tokens).")] = "kl",
    quantize: Annotated[str, typer.Option(help="lora: none | 8bit | 4bit (bitsandbytes).")] = (
        "none"
    ),
    lora_r: Annotated[int, typer.Option(help="LoRA rank.")] = 16,
    lora_alpha: Annotated[int, typer.Option(help="LoRA alpha.")] = 32,
    lora_dropout: Annotated[float, typer.Option(help="LoRA dropout.")] = 0.0,
    target_modules: Annotated[
        str, typer.Option(help="LoRA: all-linear or comma-separated module names.")
    ] = "all-linear",
    steps: Annotated[
        int | None,
        typer.Option(
            help="Optimizer steps (head/lora/full; default 200, or no limit with --minutes)."
        ),
    ] = None,
    minutes: Annotated[
        float | None,
        typer.Option(help="Stop after this many minutes in optimizer steps (resumable)."),
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Windows per step.")] = 4,
    max_seq_len: Annotated[int, typer.Option(help="Positions per window.")] = 256,
    lr: Annotated[float | None, typer.Option(help="Learning rate (default: the kind's).")] = None,
    seed: Annotated[int, typer.Option(help="Seed: the same seed gives the same draft.")] = 0,
    checkpoint_every: Annotated[int, typer.Option(help="Steps between checkpoints.")] = 50,
    eval_every: Annotated[int, typer.Option(help="Steps between held-out evaluations.")] = 50,
    draft_vocab: Annotated[
        int | None, typer.Option(help="head: reduced vocabulary size (default: full).")
    ] = None,
    intermediate_size: Annotated[int | None, typer.Option(help="head: FFN width.")] = None,
    head_layout: Annotated[
        str,
        typer.Option(help="head: specops | eagle (EAGLE-1's, the one vLLM's eagle method loads)."),
    ] = "specops",
    depths: Annotated[
        int,
        typer.Option(
            help="head: draft steps the training unrolls on its own features (1-8; the k "
            "it will draft)."
        ),
    ] = 2,
    store: Annotated[Path, typer.Option(help="suffix/ngram: the record store.")] = Path("data"),
    include_prompts: Annotated[
        bool, typer.Option("--include-prompts", help="suffix/ngram: index prompts too.")
    ] = False,
    hardware: Annotated[
        str | None, typer.Option(help="suffix/ngram: only this target's records.")
    ] = None,
    ngram_n: Annotated[int, typer.Option(help="ngram: the longest k-gram (N >= 2).")] = 4,
    fallback: Annotated[
        str,
        typer.Option(
            help="ngram: stop | shared (a store of the record store's outputs, in the "
            "package) | target (the target's guesses from its last pass)."
        ),
    ] = "shared",
    min_conf: Annotated[float, typer.Option(help="ngram: the least frequency drafted.")] = 0.0,
    k: Annotated[int, typer.Option("--k", help="The package's (maximum) draft length.")] = 5,
    policy: Annotated[
        str, typer.Option(help=f"The package's policy: {POLICY_NAMES}.")
    ] = DEFAULT_POLICY,
    threads: Threads = 2,
) -> None:
    """Train a draft and write it as a draft package to OUT."""
    from serving.hardware import engine_target
    from serving.loader import load_target, set_threads

    if kind not in DRAFT_KINDS:
        fail(f"unknown kind {kind!r}; choose one of {', '.join(DRAFT_KINDS)}")
    with failing(settings=True):
        if kind == "suffix":
            typer.echo(_train_suffix(out, store, include_prompts, hardware, k, policy))
            return
        if kind == "ngram":
            options = (ngram_n, fallback, min_conf)
            typer.echo(_train_ngram(out, options, store, include_prompts, hardware, k, policy))
            return
        # Every setting is checked before the target loads.
        manifest = _manifest(kind, k, policy, "head:head" if kind == "head" else "model:weights")
        common = {
            "teacher_dir": teacher,
            "output_dir": work_dir or out.with_name(out.name + ".work"),
            "seed": seed,
            "max_steps": steps if steps is not None else (200 if minutes is None else 10**9),
            "batch_size": batch_size,
            "max_seq_len": max_seq_len,
            "checkpoint_every": checkpoint_every,
            "eval_every": eval_every,
            **({"learning_rate": lr} if lr is not None else {}),
        }
        if kind == "head":
            from tasks.train.train_head import TrainHeadConfig

            config: Any = TrainHeadConfig(
                **common,
                draft_vocab_size=draft_vocab,
                intermediate_size=intermediate_size,
                layout=head_layout,
                depths=depths,
            )
        else:
            from tasks.train.distill import DistillConfig
            from tasks.train.distill_model import check_quantize_available

            config = DistillConfig(
                **common,
                kind=kind,
                layers=None if draft_model is not None else layers,
                draft_model=draft_model,
                loss=loss,
                quantize=quantize,
                lora_r=lora_r,
                lora_alpha=lora_alpha,
                lora_dropout=lora_dropout,
                target_modules=(
                    target_modules
                    if target_modules == "all-linear"
                    else tuple(m.strip() for m in target_modules.split(",") if m.strip())
                ),
            )
            check_quantize_available(config.quantize)
        _check_teacher_source(teacher, build_teacher)
        if minutes is not None and not minutes > 0:
            fail(f"--minutes must be > 0, got {minutes}")
        budget = None if minutes is None else 60.0 * minutes
        set_threads(threads)
        # Stock kernels: a layers draft copies the target's weights, which packed layers lack.
        loaded = load_target(target, engine_target("cpu-stock"))
        if build_teacher is not None:
            _build_teacher(loaded, teacher, build_teacher, teacher_new_tokens, max_prompt_tokens)
        if kind == "head":
            summary = _finish_head(config, loaded.model, manifest, out, budget)
        else:
            summary = _finish_distill(config, loaded, manifest, out, budget)
    typer.echo(summary)


def _check_teacher_source(teacher: Path, build: int | None) -> None:
    from serving.errors import BadInputError
    from tasks.train.teacher import MANIFEST

    if build is not None and build < 1:
        raise BadInputError(f"--build-teacher needs N >= 1 prompts, got {build}")
    if build is None and not (teacher / MANIFEST).is_file():
        raise BadInputError(
            f"no teacher cache at {teacher} ({MANIFEST} is missing); give --teacher DIR of a "
            "cache built from this target, or --build-teacher N to build one"
        )


def _build_teacher(
    target: LoadedTarget, teacher: Path, n: int, new_tokens: int, max_prompt: int
) -> TeacherReport:
    """The teacher cache of ``target``'s greedy answers to ``n`` ShareGPT prompts."""
    from tasks.train.teacher import TeacherConfig
    from tasks.train.teacher_build import build_teacher_cache, sharegpt_teacher_prompts

    prompts = sharegpt_teacher_prompts(target.tokenizer, n, max_prompt_tokens=max_prompt)
    return build_teacher_cache(
        target.model,
        prompts,
        teacher,
        eos_token_ids=list(target.eos_token_ids),
        config=TeacherConfig(max_new_tokens=new_tokens),
    )


def _train_suffix(out, store, include_prompts, hardware, k, policy) -> str:
    import tempfile

    from serving.engine.drafters.package import write_package
    from tasks.train.suffix_index import build_suffix_index_from_store

    manifest = _manifest("suffix", k, policy, "suffix:corpus.json")
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "corpus.json"
        corpus = build_suffix_index_from_store(
            store, path, hardware_name=hardware, include_prompts=include_prompts
        )
        tokens = sum(map(len, corpus.sequences))
        manifest = manifest.model_copy(
            update={
                "description": f"suffix corpus of {len(corpus.sequences)} sequences, "
                f"{tokens} tokens, from {store}"
            }
        )
        folder = write_package(out, manifest, {"corpus.json": path})
    return f"suffix draft: {len(corpus.sequences)} sequences, {tokens} tokens -> {folder}"


def _train_ngram(out, options, store, include_prompts, hardware, k, policy) -> str:
    """An n-gram draft package: with ``fallback=shared`` its shared store is a corpus of
    the record store's outputs (the suffix draft's builder), carried in the package."""
    import tempfile

    from serving.engine.drafters.factory import NGRAM_FALLBACKS, NgramOptions, parse_ngram_options
    from serving.engine.drafters.package import write_package
    from serving.errors import BadInputError
    from tasks.train.suffix_index import build_suffix_index_from_store

    n, fallback, min_conf = options
    if fallback not in NGRAM_FALLBACKS:
        raise BadInputError(f"--fallback {fallback!r} is not one of {', '.join(NGRAM_FALLBACKS)}")
    checked = parse_ngram_options("ngram", f"{n},min_conf={min_conf}")  # n and min_conf
    shared = fallback == "shared"
    spec = NgramOptions(checked.n, fallback, checked.min_conf, "store.json" if shared else None)
    drafter = f"ngram:{spec.arg()}" if spec.arg() else "ngram"
    manifest = _manifest("ngram", k, policy, drafter)
    if not shared:
        return f"n-gram draft {drafter} -> {write_package(out, manifest)}"
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "store.json"
        corpus = build_suffix_index_from_store(
            store, path, hardware_name=hardware, include_prompts=include_prompts
        )
        tokens = sum(map(len, corpus.sequences))
        described = f"n-gram store of {len(corpus.sequences)} sequences, {tokens} tokens"
        manifest = manifest.model_copy(update={"description": f"{described}, from {store}"})
        folder = write_package(out, manifest, {"store.json": path})
    return f"n-gram draft {drafter}: {described} -> {folder}"


def _finish_head(
    config: TrainHeadConfig,
    model: PreTrainedModel,
    manifest: DraftManifest,
    out: Path,
    budget_s: float | None,
) -> str:
    from tasks.train.train_head import train_head, write_head_package

    result = train_head(config, model, max_train_seconds=budget_s)
    first, last = result.history[0], result.final
    folder = write_head_package(result, config, out, k=manifest.k, policy=manifest.policy)
    return (
        f"head draft: {result.steps} steps ({result.train_seconds / 60:.1f} min); held-out "
        f"agreement {_fmt(first.agreement)} -> "
        f"{_fmt(last.agreement)} (loss {first.loss:.4f} -> {last.loss:.4f}) -> {folder}"
    )


def _finish_distill(
    config: DistillConfig,
    target: LoadedTarget,
    manifest: DraftManifest,
    out: Path,
    budget_s: float | None,
) -> str:
    from tasks.train.distill import distill, write_draft_package

    result = distill(config, target.model, tokenizer=target.tokenizer, max_train_seconds=budget_s)
    first, last = result.history[0], result.final
    folder = write_draft_package(result, out, k=manifest.k, policy=manifest.policy)
    return (
        f"{config.kind} draft: {result.steps} steps, {result.trainable_parameters} trainable "
        f"parameters; held-out agreement {_fmt(first.agreement)} -> {_fmt(last.agreement)} "
        f"(loss {first.loss:.4f} -> {last.loss:.4f}) -> {folder}"
    )


def eval_draft(
    package: Annotated[Path, typer.Argument(help="The draft package to evaluate.")],
    baseline_package: Annotated[
        Path | None, typer.Option(help="A second package to compare with (e.g. the champion).")
    ] = None,
    workload: Annotated[str, typer.Option(help="sharegpt | humaneval | grounded.")] = "sharegpt",
    prompts: Annotated[int, typer.Option(help="Held-out prompts.")] = 8,
    max_new_tokens: Annotated[int, typer.Option(help="Token budget per prompt.")] = 64,
    threads: Threads = 2,
    seed: Annotated[int, typer.Option(help="Prompt-selection seed.")] = 0,
    target: Target = DEFAULT_TARGET,
    hardware: Hardware = DEFAULT_HARDWARE,
    out: Annotated[Path, typer.Option(help="Results file.")] = Path("results/eval-draft.json"),
) -> None:
    """Evaluate a draft package against plain decoding on held-out prompts.

    Greedy; prints acceptance, mean accepted length, acceptance by position, speedup and
    whether the output equals plain decoding's (lossless); writes the JSON report."""
    from serving.atomic import write_json_atomic
    from serving.engine.drafters.package import read_manifest
    from serving.hardware import engine_target
    from tasks.data.traffic import build_workload
    from tasks.evaluate.evaluate import Contender, evaluate

    with failing():
        if prompts < 1:
            fail(f"--prompts must be >= 1, got {prompts}")
        if max_new_tokens < 1:
            fail(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
        contenders = [Contender("draft", package)]
        if baseline_package is not None:
            contenders.append(Contender("baseline", baseline_package))
        for contender in contenders:
            read_manifest(contender.package)  # a broken package fails before the model loads
        engine = engine_target(hardware)
        chosen = build_workload(workload, prompts, seed=seed, split="heldout")
        loaded = load_engine_target(target, engine, threads)
        report = evaluate(contenders, chosen, target=loaded, max_new_tokens=max_new_tokens)
    options = [str(package)]
    if baseline_package is not None:
        options += ["--baseline-package", str(baseline_package)]
    given = {
        "--workload": workload,
        "--prompts": prompts,
        "--max-new-tokens": max_new_tokens,
        "--threads": threads,
        "--seed": seed,
        "--target": target,
        "--hardware": hardware,
        "--out": out,
    }
    options += [str(part) for pair in given.items() for part in pair]
    report["command"] = "specops eval-draft " + shlex.join(options)
    report["threads"] = threads
    report["workload"] = workload
    write_json_atomic(out, report)
    typer.echo(format_report(report))
    typer.echo(f"results: {out}")


def format_report(report: dict[str, Any]) -> str:
    """One block per contender: the numbers :mod:`serving.engine.metrics` defines."""
    lines = [
        f"{report['prompts']} held-out prompts x {report['max_new_tokens']} tokens on "
        f"{report['hardware']}"
    ]
    for name, result in report["results"].items():
        if name == "plain":
            lines.append(f"plain: {_fmt(result['tokens_per_s'], '.1f')} tok/s")
            continue
        by_position = ", ".join(_fmt(v, ".2f") for v in result["acceptance_by_position"])
        lines.append(
            f"{name} ({report['contenders'][name]}): acceptance "
            f"{_fmt(result['acceptance_rate'])} | mean accepted length "
            f"{_fmt(result['mean_accepted_length'], '.2f')} | speedup "
            f"{_fmt(result['speedup'], '.2f')}x | lossless "
            f"{'yes' if result['lossless'] else 'NO'}\n"
            f"  acceptance by position: [{by_position or 'n/a'}]"
        )
    return "\n".join(lines)
