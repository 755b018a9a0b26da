"""Contract fixtures: what today's code writes, stored so that a refactor can prove that
stored names and wire names did not change (``tests/contracts/`` reads every one back).

    python scripts/make_contract_fixtures.py                        # every fixture
    python scripts/make_contract_fixtures.py --only packages,http   # some of them
    python scripts/make_contract_fixtures.py --only bench           # the real model: minutes
    python scripts/make_contract_fixtures.py --only bench --bench-json results/bench.json

Each artefact is made by the product's own functions on tiny random models (the tiny Llama
of :mod:`serving.models.tiny` with the tests' character tokenizer; the server's tiny target
with the real tokenizer, as the server tests do), except the bench's token ids, which are
the shipped SmolLM2-135M's by definition. Written under ``--out``
(``tests/fixtures/contracts``), each file atomically:

- ``packages/<kind>/``: a draft package of every drafter kind with a package form (all but
  ``none``): the loop's built-in packages (``pld``, ``layers``), ``specops train-draft``'s
  n-gram (with and without ``store=``) and suffix packages from a collected record store,
  and a head, a LoRA and a full draft (``model:``) trained for four steps and written by
  the trainers' package writers;
- ``teacher-manifest.json``: the manifest of the teacher cache those drafts trained on;
- ``evaluation.json``: an evaluation file (``write_evaluation_file``) of a real tiny
  ``evaluate()`` of the pld, head and LoRA packages;
- ``mlflow.json``: registered models, versions, tags, aliases, runs, params, metric keys
  (with their steps) and artifact paths, after registering those three drafts, logging
  that evaluation file (``specops registry log-evaluation``), promoting, marking a
  challenger and rolling back, on a SQLite store;
- ``http/``: one file per request to the server (FastAPI's TestClient, lifespan included)
  with its response: completions and chats for every ``drafter`` a request may name
  (``champion``, ``cascade`` and each HTTP kind), streams, errors, ``/health``,
  ``/v1/models``; ``metrics.json`` (the Prometheus families and label names),
  ``captured-records.json`` (the records the server captured of them) and
  ``describe.json`` (what ``SpeculativeDecoder.describe()`` reports for every kind);
- ``kit-manifest.json`` (``build_kit``'s ``kit.json``) and ``kit-bundle/`` (the evaluation
  bundle it carries, from ``prepare_bundle``);
- ``bench-token-ids.json``: per method and prompt, the token ids ``specops bench --prompts 2
  --max-new-tokens 64 --threads 2`` generated (the ``runs`` of its bench.json, which holds
  them; timings and the machine left out).

Deterministic: fixed seeds (the tiny models', the prompts', the training runs'), greedy
decoding, one torch thread. What still varies from run to run is normalised here, once; the
tests reuse these functions:

- time (:func:`normalise_timings`): moments (``created``, ``timestamp``, ``*_at``, ISO
  dates) become the epoch, measured durations (``*_s``, ``seconds``) 1.0, measured speeds
  100.0, speedups 1.0 (null kept, so an evaluation file stays consistent), profiled costs
  0.0; library versions and the host ``<version>``, ``<host>``;
- identities: MLflow run ids ``<run:RUN NAME>``, answer ids ``cmpl-<id>``, record ids and
  the capture run ``<id>``, ``<run>``, git commits ``<commit>``, the kit's archives' sizes
  and sha256 0 (values its reader still takes);
- paths: the temporary folders ``<work>``, the fixtures folder ``<fixtures>``; MLflow's
  own ``mlflow.*`` tags are dropped (who ran it, from which file).

How much a cost-aware policy or the cascade drafts follows the step times it measures and
is not repeatable: the packages and the requests draft under a fixed policy, and the tests
compare the cascade's answers (and its records) by their names only (:func:`name_paths`).
Weights are kept on disk (tens of KB) and compared by file name.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: the checkout's packages, not an install's
    sys.path.insert(0, str(ROOT))

DEFAULT_OUT = ROOT / "tests" / "fixtures" / "contracts"
SEED = 0
HARDWARE = "cpu"
PARTS = ("packages", "teacher", "evaluation", "mlflow", "http", "kit", "bench")

JSON = Any  # a JSON value


# ------------------------------------------------------------------------- normalisation

# Moments (Unix seconds or ISO 8601) become the epoch; measured durations 1.0 s; measured
# speeds 100 tokens/s; speedups 1.0; profiled costs 0.0. Keys of settings (a kit's
# ``command_s``) are never passed through here: only measured artefacts are.
MOMENT_KEYS = frozenset({"created", "timestamp", "at", "started", "finished"})
DURATION_KEYS = frozenset({"seconds", "round_seconds", "train_seconds"})
SPEED_KEYS = frozenset({"tokens_per_s", "train_tokens_per_s"})
RATIO_KEYS = frozenset({"speedup", "predicted_speedups", "judged_speedup"})
COST_KEYS = frozenset({"draft_costs", "merge_max_abs_diff"})
# Relative costs measured from timed passes (the first point is 1 by definition).
CURVE_KEYS = frozenset({"evaluated_curve"})
VERSION_KEYS = frozenset({"python", "torch", "transformers"})
EPOCH_ISO = "1970-01-01T00:00:00Z"
_ISO_MOMENT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:?\d\d)?")


def _is_moment(key: str) -> bool:
    return key in MOMENT_KEYS or key.endswith("_at")


def _is_duration(key: str) -> bool:
    return key in DURATION_KEYS or (key.endswith("_s") and key not in SPEED_KEYS)


def _every_number(value: JSON, number: float) -> JSON:
    """``value`` with each number (in nested lists and dicts too) made ``number``; an ISO
    moment the epoch; null, booleans and other strings kept."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return type(value)(number)
    if isinstance(value, str):
        return EPOCH_ISO if _ISO_MOMENT.fullmatch(value) else value
    if isinstance(value, list):
        return [_every_number(item, number) for item in value]
    if isinstance(value, dict):
        return {key: _every_number(item, number) for key, item in value.items()}
    return value


def _timing_rule(key: str) -> float | None:
    """What a measured value under ``key`` becomes, or None when it is not measured."""
    if _is_moment(key):
        return 0.0
    if key in SPEED_KEYS:
        return 100.0
    if key in RATIO_KEYS:
        return 1.0
    if _is_duration(key) or key in CURVE_KEYS:
        return 1.0
    if key in COST_KEYS:
        return 0.0
    return None


def normalise_timings(value: JSON) -> JSON:
    """Moments, durations, speeds, speedups and profiled costs made constants (null kept,
    so an evaluation file stays consistent: each speedup is still its tokens/s over plain
    decoding's); library versions ``<version>``."""
    if isinstance(value, list):
        return [normalise_timings(item) for item in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, JSON] = {}
    for key, item in value.items():
        rule = _timing_rule(key)
        if rule is not None:
            out[key] = _every_number(item, rule)
        elif key in VERSION_KEYS and isinstance(item, str):
            out[key] = "<version>"
        else:
            out[key] = normalise_timings(item)
    return out


def normalise_paths(value: JSON, roots: Mapping[Path, str]) -> JSON:
    """Every string holding one of ``roots`` (absolute folders) with that root replaced by
    its placeholder; the longest root first, so a folder inside another keeps its own."""
    ordered = sorted(((str(k), v) for k, v in roots.items()), key=lambda kv: -len(kv[0]))

    def fix(text: str) -> str:
        for root, placeholder in ordered:
            text = text.replace(root, placeholder)
        return text

    return map_strings(value, fix)


def map_strings(value: JSON, fix: Callable[[str], str]) -> JSON:
    """``value`` with ``fix`` applied to every string in it, dictionary keys included."""
    if isinstance(value, str):
        return fix(value)
    if isinstance(value, list):
        return [map_strings(item, fix) for item in value]
    if isinstance(value, dict):
        return {fix(key): map_strings(item, fix) for key, item in value.items()}
    return value


# Free text: generated or written for people. Its value is left out of the names (a
# stream's chunks split it differently from run to run).
FREE_TEXT_KEYS = frozenset({"text", "content", "output_text", "prompt", "message", "description"})


def name_paths(value: JSON, *, values: bool = True, prefix: str = "") -> set[str]:
    """The names in ``value``, as a set of paths: ``usage/speculative/draft_version = pld``
    for a string (its value left out under :data:`FREE_TEXT_KEYS`, or everywhere when
    ``values`` is false), ``.../acceptance_rate: number`` for a number or null (a rate is
    null when nothing was drafted, and how much is drafted follows the measured step times
    of the cost-aware policies), ``: bool``, and ``: list`` for a list, whose objects' and
    lists' paths follow under ``[]`` (a list of plain values is one path, whatever it
    holds). A set, so that a list of records gives the union of their names: two
    documents with the same paths use the same names, and the difference of two sets says
    which name changed."""
    if isinstance(value, dict):
        found: set[str] = set()
        for key, item in value.items():
            path = f"{prefix}/{key}" if prefix else str(key)
            if isinstance(item, str) and (not values or key in FREE_TEXT_KEYS):
                found.add(f"{path}: str")
            else:
                found |= name_paths(item, values=values, prefix=path)
        return found
    if isinstance(value, list):
        found = {f"{prefix}: list"}
        for item in value:
            if isinstance(item, dict | list):
                found |= name_paths(item, values=values, prefix=f"{prefix}[]")
        return found
    if isinstance(value, bool):
        return {f"{prefix}: bool"}
    if isinstance(value, str):
        return {f"{prefix} = {value}" if values else f"{prefix}: str"}
    return {f"{prefix}: number"}


_NUMBER_IN_TEXT = re.compile(r"\d+(\.\d+)?")


def mask_numbers(text: str) -> str:
    """``text`` with every number ``<n>``: a description's wording without its figures."""
    return _NUMBER_IN_TEXT.sub("<n>", text)


# ----------------------------------------------------------------------------- writing


def write_json(path: Path, payload: JSON) -> Path:
    """``payload`` as indented JSON at ``path``, atomically (:mod:`serving.atomic`)."""
    from serving.atomic import write_text_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    return path


def read_json(path: Path) -> JSON:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def install_folder(source: Path, folder: Path) -> Path:
    """``source``'s files copied to ``folder`` atomically (an existing ``folder`` is
    replaced whole)."""
    from serving.atomic import atomic_dir

    with atomic_dir(folder) as scratch:
        shutil.copytree(source, scratch, dirs_exist_ok=True)
    return folder


@contextlib.contextmanager
def scratch_dir(name: str) -> Iterator[Path]:
    """A temporary folder (resolved: its path is what the artefacts record), removed after."""
    with tempfile.TemporaryDirectory(prefix=f"specops-contracts-{name}-") as folder:
        yield Path(folder).resolve()


@contextlib.contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """Environment variables set (None: unset) inside, restored after."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch on ``count`` threads inside (the tiny models' results do not depend on it,
    their speed does), the previous count after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------------ the tiny world

# Random token prompts for the teacher cache (ids 3..95: the tiny target's text ids).
TEACHER_PROMPTS, TEACHER_PROMPT_LEN, TEACHER_NEW_TOKENS = 12, 8, 16
# Short texts with repeats, so that prompt lookup and the n-gram store find something.
TEXTS = (
    "abc abc abc abc",
    "the cat sat on the mat; the cat",
    "hello hello hello",
    "1212121212",
    "fix: teh teh teh",
    "aaaa bbbb aaaa bbbb",
)


@dataclass(frozen=True)
class TinyWorld:
    """The tiny random target (in memory, and saved as a model folder with the character
    tokenizer) and a teacher cache of its greedy answers: what the trainers train on."""

    work: Path
    target: Any
    tokenizer: Any
    folder: Path  # the target saved with its tokenizer (a local model folder)
    teacher: Path  # the teacher cache (manifest.json and shards)


def char_tokenizer() -> Any:
    """The tests' character tokenizer: 93 characters and pad/BOS/EOS, the tiny target's 96
    ids (tests/specops/conftest.py)."""
    from tests.specops.conftest import make_char_tokenizer

    return make_char_tokenizer()


def teacher_prompts() -> list[Any]:
    """Random token prompts ``p0, p1, ...`` (seeded)."""
    import torch

    from tasks.train.teacher_build import TeacherPrompt

    generator = torch.Generator().manual_seed(SEED)
    return [
        TeacherPrompt(
            f"p{i}", torch.randint(3, 96, (TEACHER_PROMPT_LEN,), generator=generator).tolist()
        )
        for i in range(TEACHER_PROMPTS)
    ]


def as_target(model: Any, tokenizer: Any, *, eos: list[int] | None = None) -> Any:
    """``model`` as the tiny world's loaded target: on :data:`HARDWARE`'s curve, as it is
    (no kernels), ending at its end-of-sequence ids (``eos``, default its own)."""
    from serving.hardware import engine_target
    from serving.target import LoadedTarget, eos_ids

    ids = eos if eos is not None else eos_ids(model, tokenizer)
    return LoadedTarget.of(model, tokenizer, hardware=engine_target(HARDWARE), eos_token_ids=ids)


def tiny_world(work: Path) -> TinyWorld:
    """Build the tiny world under ``work``: the target folder and the teacher cache
    (:func:`tasks.train.teacher_build.build_teacher_cache`, as ``--build-teacher`` does)."""
    from serving.models.tiny import tiny_llama
    from tasks.train.teacher import TeacherConfig
    from tasks.train.teacher_build import build_teacher_cache

    target, tokenizer = tiny_llama(seed=SEED), char_tokenizer()
    folder = work / "target"
    target.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    teacher = work / "teacher"
    build_teacher_cache(
        target,
        teacher_prompts(),
        teacher,
        eos_token_ids=[int(tokenizer.eos_token_id)],
        config=TeacherConfig(max_new_tokens=TEACHER_NEW_TOKENS),
        progress=False,
    )
    return TinyWorld(work, target, tokenizer, folder, teacher)


def text_prompts(count: int = len(TEXTS), *, split: str = "heldout") -> list[Any]:
    """Chat prompts ``p0, p1, ...`` of :data:`TEXTS` (workload ``grounded``)."""
    from tasks.data.prompts import Prompt

    return [
        Prompt(
            id=f"p{i}",
            workload="grounded",
            messages=[{"role": "user", "content": text}],
            reference=None,
            split=split,  # type: ignore[arg-type]
        )
        for i, text in enumerate(TEXTS[:count])
    ]


# ------------------------------------------------------------------------------ packages

# Every drafter kind with a package form (serving/drafters/kinds.py), by fixture folder.
# ``none`` has none: it drafts nothing, and no product code packages it.
PACKAGE_KINDS = ("pld", "ngram", "ngram-store", "suffix", "layers", "model", "head", "lora")
TRAIN_STEPS = 4  # optimiser steps of each trained draft: a few, so it is quick and exact
# The packages' draft-length policy. The product's default, the cost-aware policy, sizes
# each draft by the step times it measures, so what a run with it drafts (and so an
# evaluation's or a response's drafting counts) is not repeatable; a manifest is read the
# same whichever policy it names, and describe.json records the cost-aware one too.
PACKAGE_POLICY = "fixed"
TRAIN_SETTINGS = {
    "max_steps": TRAIN_STEPS,
    "batch_size": 2,
    "max_seq_len": 32,
    "eval_every": 2,
    "checkpoint_every": 2,
    "eval_fraction": 0.25,
    "seed": SEED,
}
# Third-party files inside packages: compared by name only (their keys are the libraries').
FOREIGN_FILES = frozenset(
    {"adapter_config.json", "README.md", "config.json", "generation_config.json",
     "tokenizer.json", "tokenizer_config.json"}
)  # fmt: skip


@dataclass(frozen=True)
class BuiltPackage:
    """A draft package as its writer left it, and what its training run reports (the
    TrainResult or DistillResult of a trained family, None otherwise)."""

    kind: str
    folder: Path
    result: Any = None


def record_store(world: TinyWorld) -> Path:
    """A record store of the tiny target's answers to :data:`TEXTS` (training split),
    collected with prompt lookup (:func:`tasks.data.collect.collect`): the traffic the
    n-gram and suffix trainers index (collected once per world)."""
    from serving.engine.build import build_decoder
    from serving.engine.drafters.plan import DraftPlan
    from serving.hardware import hardware_target
    from tasks.data.collect import collect

    store = world.work / "store"
    if store.is_dir():
        return store
    decoder = build_decoder(
        as_target(world.target, world.tokenizer, eos=[int(world.tokenizer.eos_token_id)]),
        DraftPlan.parse("pld:3", policy="fixed", k=4),
    )
    collect(
        text_prompts(split="train"), decoder=decoder, tokenizer=world.tokenizer,
        store_root=store, run_id="contracts", hardware=hardware_target(HARDWARE),
        max_new_tokens=16,
        progress=False,
    )  # fmt: skip
    return store


def train_draft_cli(*args: str) -> None:
    """Run ``specops train-draft ARGS --policy fixed`` in this process; fail naming its
    output."""
    from typer.testing import CliRunner

    from specops.cli import app

    result = CliRunner().invoke(app, ["train-draft", *args, "--policy", PACKAGE_POLICY])
    if result.exit_code != 0:
        raise RuntimeError(f"specops train-draft {' '.join(args)} failed: {result.output}")


def _builtin(drafter: str, family: str) -> Callable[[TinyWorld, Path], BuiltPackage]:
    """The loop's built-in package of ``drafter`` (how a fresh registry gets its first
    champion: :func:`tasks.loop.registry_steps.builtin_package`, its default k)."""

    def build(world: TinyWorld, out: Path) -> BuiltPackage:
        from tasks.loop.registry_steps import builtin_package

        folder = builtin_package(drafter, out / "built", family=family, policy=PACKAGE_POLICY)
        return BuiltPackage(drafter.partition(":")[0], folder)

    return build


def _ngram(world: TinyWorld, out: Path) -> BuiltPackage:
    """``specops train-draft --kind ngram --fallback target``: the manifest alone."""
    train_draft_cli("--kind", "ngram", "--fallback", "target", "--out", str(out / "ngram"))
    return BuiltPackage("ngram", out / "ngram")


def _ngram_store(world: TinyWorld, out: Path) -> BuiltPackage:
    """``specops train-draft --kind ngram`` (``fallback=shared``: a ``store=`` file of the
    record store's outputs, carried in the package)."""
    store = record_store(world)
    train_draft_cli("--kind", "ngram", "--store", str(store), "--out", str(out / "ngram-store"))
    return BuiltPackage("ngram-store", out / "ngram-store")


def _suffix(world: TinyWorld, out: Path) -> BuiltPackage:
    """``specops train-draft --kind suffix``: a corpus of the record store's outputs."""
    store = record_store(world)
    train_draft_cli("--kind", "suffix", "--store", str(store), "--out", str(out / "suffix"))
    return BuiltPackage("suffix", out / "suffix")


def _head(world: TinyWorld, out: Path) -> BuiltPackage:
    """A draft head trained for a few steps and written as ``specops train-draft --kind
    head`` writes it (:func:`tasks.train.train_head.write_head_package`)."""
    from tasks.train.train_head import TrainHeadConfig, train_head, write_head_package

    config = TrainHeadConfig(
        teacher_dir=world.teacher, output_dir=out / "head.work", intermediate_size=32,
        **TRAIN_SETTINGS,
    )  # fmt: skip
    result = train_head(config, world.target, progress=False)
    folder = write_head_package(result, config, out / "head", policy=PACKAGE_POLICY)
    return BuiltPackage("head", folder, result)


def _distilled(kind: str, family: str, layers: int) -> Callable[[TinyWorld, Path], BuiltPackage]:
    """A LoRA or full draft of the target's first ``layers`` layers, distilled for a few
    steps and written as ``specops train-draft`` writes it
    (:func:`tasks.train.distill.write_draft_package`)."""

    def build(world: TinyWorld, out: Path) -> BuiltPackage:
        from tasks.train.distill import DistillConfig, distill, write_draft_package

        config = DistillConfig(
            teacher_dir=world.teacher, output_dir=out / f"{kind}.work", kind=family,
            layers=layers, lora_r=2, lora_alpha=4, **TRAIN_SETTINGS,
        )  # fmt: skip
        result = distill(config, world.target, tokenizer=world.tokenizer, progress=False)
        folder = write_draft_package(result, out / kind, policy=PACKAGE_POLICY)
        return BuiltPackage(kind, folder, result)

    return build


PACKAGE_BUILDERS: dict[str, Callable[[TinyWorld, Path], BuiltPackage]] = {
    "pld": _builtin("pld:3", "ngram"),
    "ngram": _ngram,
    "ngram-store": _ngram_store,
    "suffix": _suffix,
    "layers": _builtin("layers:2", "layers"),
    "model": _distilled("model", "full", 1),
    "head": _head,
    "lora": _distilled("lora", "lora", 2),
}


def build_packages(
    world: TinyWorld, kinds: Sequence[str] = PACKAGE_KINDS
) -> dict[str, BuiltPackage]:
    """A package of each of ``kinds``, under ``world.work / "packages"``, normalised."""
    out = world.work / "packages"
    built: dict[str, BuiltPackage] = {}
    with torch_threads(1):
        for kind in kinds:
            if kind not in PACKAGE_BUILDERS:
                raise ValueError(f"no package kind {kind!r}; choose from {PACKAGE_KINDS}")
            package = PACKAGE_BUILDERS[kind](world, out)
            normalise_package(package.folder, {world.work: "<work>"})
            built[kind] = package
    return built


def normalise_package(folder: Path, roots: Mapping[Path, str]) -> None:
    """Rewrite in place what varies between two builds of a package (each file in the
    format its writer used): the temporary paths in its description, the training run's
    paths and timings (train_metrics.json), the corpus' build time (corpus.json,
    store.json), the adapter's base path and target modules (peft saves a set, in hash
    order) and its model card's paths."""
    from serving.engine.drafters.package import MANIFEST, read_manifest

    manifest = read_manifest(folder)
    described = normalise_paths(manifest.description, roots)
    if described != manifest.description:
        fixed = manifest.model_copy(update={"description": described})
        (folder / MANIFEST).write_text(fixed.model_dump_json(indent=2))
    for path in sorted(folder.rglob("*")):
        fix = _PACKAGE_FILE_FIXES.get(path.name)
        if fix is not None:
            fix(path, roots)


def _fix_measured(path: Path, roots: Mapping[Path, str]) -> None:
    payload = normalise_timings(normalise_paths(read_json(path), roots))
    if path.name == "train_metrics.json":  # write_json_atomic's layout
        path.write_text(json.dumps(payload, indent=2))
    else:  # save_suffix_index's compact layout
        path.write_text(json.dumps(payload, separators=(",", ":")))


def _fix_adapter_config(path: Path, roots: Mapping[Path, str]) -> None:
    payload = normalise_paths(read_json(path), roots)
    if isinstance(payload.get("target_modules"), list):
        payload["target_modules"] = sorted(payload["target_modules"])
    path.write_text(json.dumps(payload, indent=2, sort_keys=True))


def _fix_model_card(path: Path, roots: Mapping[Path, str]) -> None:
    path.write_text(normalise_paths(path.read_text(), roots))


_PACKAGE_FILE_FIXES: dict[str, Callable[[Path, Mapping[Path, str]], None]] = {
    "train_metrics.json": _fix_measured,
    "corpus.json": _fix_measured,
    "store.json": _fix_measured,
    "adapter_config.json": _fix_adapter_config,
    "README.md": _fix_model_card,
}


def package_files(folder: Path) -> list[str]:
    """The package's files, relative and sorted."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def package_contract(folder: Path) -> dict[str, JSON]:
    """What a package's writer must keep: its manifest (the description's figures masked),
    its file names, and the keys of its own JSON files (third-party files by name only)."""
    from serving.engine.drafters.package import MANIFEST

    manifest = read_json(folder / MANIFEST)
    manifest["description"] = mask_numbers(manifest.get("description", ""))
    own = {
        name: sorted(name_paths(read_json(folder / name), values=False))
        for name in package_files(folder)
        if name.endswith(".json") and name != MANIFEST and Path(name).name not in FOREIGN_FILES
    }
    return {"manifest": manifest, "files": package_files(folder), "json_keys": own}


def write_packages(out: Path, built: Mapping[str, BuiltPackage]) -> None:
    for kind, package in built.items():
        install_folder(package.folder, out / "packages" / kind)


# ------------------------------------------------------------------------------- teacher


def build_teacher_manifest(world: TinyWorld) -> JSON:
    """The teacher cache's manifest as :func:`build_teacher_cache` wrote it (nothing in it
    varies: the in-memory target's name is its model type, its digest is of seeded
    weights)."""
    from tasks.train.teacher import MANIFEST

    return read_json(world.teacher / MANIFEST)


# ---------------------------------------------------------------------------- evaluation

# Contender -> (the package fixture it evaluates, the registry version it stands for: the
# versions mlflow.json's registrations create, in that order).
EVALUATED = {
    "champion": ("pld", "ngram/1"),
    "challenger-0": ("head", "head/1"),
    "challenger-1": ("lora", "lora/1"),
}
EVALUATION_PROMPTS, EVALUATION_NEW_TOKENS = 4, 8  # four: the gates' min_prompts


def build_evaluation(packages: Path) -> JSON:
    """An evaluation file's content: ``evaluate()`` of the :data:`EVALUATED` packages under
    ``packages`` on the tiny target, as :func:`evaluation_of` makes it, normalised (their
    paths under ``<fixtures>``, the folder that holds ``packages``)."""
    from serving.models.tiny import tiny_llama
    from tasks.evaluate.evaluate import Contender, evaluate
    from tasks.evaluate.evaluation_file import evaluation_of, machine_info

    contenders = [Contender(name, packages / kind) for name, (kind, _) in EVALUATED.items()]
    with torch_threads(1):
        report = evaluate(
            contenders,
            text_prompts(EVALUATION_PROMPTS),
            target=as_target(tiny_llama(seed=SEED), char_tokenizer()),
            max_new_tokens=EVALUATION_NEW_TOKENS,
            progress=False,
        )
    produced_by = machine_info(device=HARDWARE, started=EPOCH_ISO, finished=EPOCH_ISO)
    labels = {name: label for name, (_, label) in EVALUATED.items()}
    evaluation = evaluation_of(report, contenders=labels, produced_by=produced_by)
    return normalise_evaluation(evaluation, {packages.parent: "<fixtures>"})


def normalise_evaluation(evaluation: JSON, roots: Mapping[Path, str]) -> JSON:
    """Timings and versions (:func:`normalise_timings`), paths, and the host name."""
    evaluation = normalise_paths(normalise_timings(evaluation), roots)
    evaluation["produced_by"]["host"] = "<host>"
    return evaluation


def write_evaluation(path: Path, evaluation: JSON) -> Path:
    """Through the product's writer, which refuses a file its reader would refuse."""
    from tasks.evaluate.evaluation_file import write_evaluation_file

    write_evaluation_file(path, evaluation)
    return path


# -------------------------------------------------------------------------------- mlflow

REGISTRY_ENV = (
    "SPECOPS_MLFLOW_URI", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI",
    "SPECOPS_MLFLOW_ARTIFACTS", "SPECOPS_REGISTRY_CONFIG", "SPECOPS_CACHE",
)  # fmt: skip
LINEAGE_VALUES = {"git_commit": "<commit>"}


@contextlib.contextmanager
def registry_environment(work: Path, tracking_uri: str | None = None) -> Iterator[str]:
    """The environment every ``specops`` command's registry reads, pointing at a SQLite
    store under ``work`` (or at ``tracking_uri``, an empty migrated one), the artifacts and
    the download cache there too; yields the tracking URI."""
    uri = tracking_uri or f"sqlite:///{work / 'mlflow.db'}"
    values: dict[str, str | None] = dict.fromkeys(REGISTRY_ENV)
    values.update(
        SPECOPS_MLFLOW_URI=uri,
        SPECOPS_MLFLOW_ARTIFACTS=str(work / "mlartifacts"),
        SPECOPS_CACHE=str(work / "cache"),
    )
    with environment(**values):
        yield uri


def specops_cli(*args: str) -> str:
    """Run ``specops ARGS`` in this process; its output, or an error naming the command."""
    from typer.testing import CliRunner

    from specops.cli import app

    result = CliRunner().invoke(app, list(args))
    if result.exit_code != 0:
        raise RuntimeError(f"specops {' '.join(args)} exited {result.exit_code}: {result.output}")
    return result.output


def register_trained(
    registry: Any, package: BuiltPackage, family: Literal["head", "lora"], lineage: dict
) -> Any:
    """Register a trained package as the retrain flow does: the params every family logs
    and the training curves, from the loop's own helpers (``_run_params``, ``_curves`` of
    tasks/loop/learned.py, private: its ``train_*_challenger`` train until a time budget
    runs out, which no fixture can repeat; so their few family-specific params, ``init``
    or ``loss``, are not recorded), and the lineage tags
    (:func:`tasks.loop.lineage.lineage_tags`)."""
    from serving.hardware import hardware_target
    from tasks.loop import learned
    from tasks.loop.retrain_config import load_retrain_config

    settings = load_retrain_config().target(hardware_target(HARDWARE)).family(family)
    return registry.log_draft(
        package.folder,
        family=family,
        params=learned._run_params(package.result, settings),
        curves=learned._curves(package.result.history),
        tags=lineage,
    )


def drive_registry(work: Path, built: Mapping[str, BuiltPackage], evaluation_file: Path) -> None:
    """What the registry sees in a life: a built-in draft registered (``specops registry
    register``), two trained ones (as the retrain registers them), the evaluation file
    logged (``specops registry log-evaluation``), a bootstrap promotion, a challenger
    alias, a cross-family promotion and a rollback (``specops registry promote``,
    ``rollback``)."""
    from registry.client import Registry
    from tasks.loop.lineage import lineage_tags

    specops_cli("registry", "register", str(built["pld"].folder), "--family", "ngram")
    registry = Registry()
    (work / "empty-store").mkdir(exist_ok=True)
    lineage = lineage_tags(work / "empty-store")
    register_trained(registry, built["head"], "head", lineage)
    lora = register_trained(registry, built["lora"], "lora", lineage)
    specops_cli("registry", "log-evaluation", str(evaluation_file))
    specops_cli("registry", "promote", "ngram/1", "--hardware", HARDWARE, "--reason", "bootstrap")
    registry.set_challenger(lora, HARDWARE)
    specops_cli("registry", "promote", "head/1", "--hardware", HARDWARE, "--reason", "faster")
    specops_cli("registry", "rollback", "--hardware", HARDWARE, "--reason", "regression")


def build_mlflow(
    world: TinyWorld,
    built: Mapping[str, BuiltPackage],
    evaluation_file: Path,
    *,
    tracking_uri: str | None = None,
) -> JSON:
    """Drive a fresh SQLite registry under ``world.work`` (:func:`drive_registry`) and
    return what it holds, normalised (:func:`mlflow_snapshot`)."""
    from registry.client import Registry

    work = world.work / "mlflow"
    work.mkdir(parents=True, exist_ok=True)
    with registry_environment(work, tracking_uri):
        drive_registry(work, built, evaluation_file)
        registry = Registry()
        return mlflow_snapshot(registry, {work: "<work>", world.work: "<work>"})


def _artifacts(client: Any, run_id: str, path: str | None = None) -> list[str]:
    found: list[str] = []
    for item in client.list_artifacts(run_id, path):
        found.append(item.path + ("/" if item.is_dir else ""))
        if item.is_dir:
            found += _artifacts(client, run_id, item.path)
    return found


def _run_entry(client: Any, run: Any) -> dict[str, JSON]:
    """One run: its name, tags (MLflow's own ``mlflow.*`` left out), params, metric keys
    with the steps each was logged at, artifact paths, and the promotion record if any."""
    data = run.data
    entry: dict[str, JSON] = {
        "run_name": run.info.run_name,
        "run_id": run.info.run_id,
        "tags": {k: v for k, v in sorted(data.tags.items()) if not k.startswith("mlflow.")},
        "params": dict(sorted(data.params.items())),
        "metrics": {
            key: [m.step for m in client.get_metric_history(run.info.run_id, key)]
            for key in sorted(data.metrics)
        },
        "artifacts": _artifacts(client, run.info.run_id),
    }
    if "promotion.json" in entry["artifacts"]:
        from mlflow.artifacts import load_dict

        record = load_dict(f"{run.info.artifact_uri}/promotion.json")
        entry["promotion.json"] = normalise_timings(record)
    return entry


def mlflow_snapshot(registry: Any, roots: Mapping[Path, str]) -> JSON:
    """Registered models (tags, description, aliases, versions with their tags and
    source) and the registry's two experiments' runs, oldest first, normalised
    (:func:`normalise_mlflow`)."""
    client = registry.client
    models: dict[str, JSON] = {}
    for model in sorted(client.search_registered_models(), key=lambda m: m.name):
        versions = client.search_model_versions(f"name = '{model.name}'")
        models[model.name] = {
            "tags": dict(sorted(model.tags.items())),
            "description": model.description,
            "aliases": {alias: str(v) for alias, v in sorted(model.aliases.items())},
            "versions": {
                str(v.version): {
                    "tags": dict(sorted(v.tags.items())),
                    "source": v.source,
                    "run_id": v.run_id,
                }
                for v in sorted(versions, key=lambda v: int(v.version))
            },
        }
    experiments: dict[str, JSON] = {}
    for name in (registry.config.experiment, f"{registry.config.experiment}-promotions"):
        found = client.get_experiment_by_name(name)
        runs = client.search_runs([found.experiment_id], order_by=["attributes.start_time ASC"])
        experiments[name] = {
            "artifact_location": found.artifact_location,
            "runs": [_run_entry(client, run) for run in runs],
        }
    snapshot = {"registered_models": models, "experiments": experiments}
    return normalise_mlflow(snapshot, roots)


_FLOAT_TEXT = re.compile(r"-?\d+\.\d*(e-?\d+)?|-?\d+e-?\d+|nan|inf")


def _run_labels(snapshot: JSON) -> dict[str, str]:
    """Run id -> ``<run:NAME>`` (``#2``, ``#3`` for later runs of the same name), oldest
    first."""
    labels: dict[str, str] = {}
    seen: dict[str, int] = {}
    for experiment in snapshot["experiments"].values():
        for run in experiment["runs"]:
            name = run["run_name"]
            seen[name] = seen.get(name, 0) + 1
            suffix = "" if seen[name] == 1 else f"#{seen[name]}"
            labels[run["run_id"]] = f"<run:{name}{suffix}>"
    return labels


def normalise_mlflow(snapshot: JSON, roots: Mapping[Path, str]) -> JSON:
    """Run ids as ``<run:NAME>``, temporary paths as ``<work>``, numbers written as text in
    tags and params (measurements: ``cpu/speedup``, ``promoted_at.cpu``) as ``<number>``,
    the git commit as ``<commit>``."""
    labels = _run_labels(snapshot)

    def fix(text: str) -> str:
        for run_id, label in labels.items():
            text = text.replace(run_id, label)
        return text

    snapshot = normalise_paths(map_strings(snapshot, fix), roots)
    for model in snapshot["registered_models"].values():
        for version in model["versions"].values():
            version["tags"] = _normalised_values(version["tags"])
    for experiment in snapshot["experiments"].values():
        for run in experiment["runs"]:
            run["tags"] = _normalised_values(run["tags"])
            run["params"] = _normalised_values(run["params"])
    return snapshot


def _normalised_values(values: dict[str, str]) -> dict[str, str]:
    out = {}
    for key, value in values.items():
        if key in LINEAGE_VALUES:
            out[key] = LINEAGE_VALUES[key]
        elif _FLOAT_TEXT.fullmatch(value.strip().lower()):
            out[key] = "<number>"
        else:
            out[key] = value
    return out


# ---------------------------------------------------------------------------------- http

# The ``drafter`` values a request sends: each of serving.server.schemas.HTTP_DRAFTERS,
# some with arguments.
SENT_DRAFTERS = (
    "champion", "none", "pld", "pld:2", "ngram", "ngram:3,fallback=target,min_conf=0.1",
    "layers", "layers:1", "cascade",
)  # fmt: skip
CASCADE_STAGES = "suffix,pld:3,ngram:4"
# The champion the server serves: the n-gram package with its store (served from a local
# pointer, as a promotion writes it), under a registry label.
CHAMPION_PACKAGE, CHAMPION_LABEL = "ngram-store", "specops-draft-ngram/2"
CHAT_TEXT, COMPLETION_TEXT = "abc abc abc abc", "def add(a, b): return a + b; def add("
HTTP_NEW_TOKENS = 8


# How much a cost-aware policy or the cascade drafts follows the step times it measures;
# a fixed policy drafts the same on every run, so these requests' numbers are exact.
FIXED = {"draft_policy": "fixed", "num_speculative_tokens": 4}


@dataclass(frozen=True)
class Exchange:
    """One request to the server: its fixture name, method, path and JSON body (``raw``:
    bytes sent as they are, for a body that is not JSON), and whether its answer is the
    same on every run (``exact``), or only its names (it drafts as measured times say)."""

    name: str
    method: str
    path: str
    body: JSON = None
    raw: str | None = None
    exact: bool = True

    def request(self) -> dict[str, JSON]:
        sent: dict[str, JSON] = {"method": self.method, "path": self.path}
        if self.raw is not None:
            sent["raw"] = self.raw
        elif self.body is not None:
            sent["body"] = self.body
        return sent


def _slug(drafter: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", drafter.lower()).strip("-")


def _chat(drafter: str, **fields: JSON) -> dict[str, JSON]:
    return {
        "model": "smollm2",
        "messages": [{"role": "user", "content": CHAT_TEXT}],
        "max_tokens": HTTP_NEW_TOKENS,
        "temperature": 0,
        "drafter": drafter,
        **fields,
    }


def _completion(drafter: str, **fields: JSON) -> dict[str, JSON]:
    return {
        "model": "smollm2",
        "prompt": COMPLETION_TEXT,
        "max_tokens": HTTP_NEW_TOKENS,
        "temperature": 0,
        "drafter": drafter,
        **fields,
    }


def _per_drafter(kind: str, path: str, body: Callable[..., dict[str, JSON]]) -> list[Exchange]:
    """One request per :data:`SENT_DRAFTERS` (fixed policy; the cascade has its own)."""
    return [
        Exchange(f"{kind}-{_slug(d)}", "POST", path, body(d, **({} if d == "cascade" else FIXED)),
                 exact=d != "cascade")
        for d in SENT_DRAFTERS
    ]  # fmt: skip


def http_exchanges() -> list[Exchange]:
    """Every request of the HTTP fixtures, in the order they are sent."""
    chat, completion = "/v1/chat/completions", "/v1/completions"
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    return [
        *_per_drafter("chat", chat, _chat),
        *_per_drafter("completion", completion, _completion),
        Exchange("chat-champion-defaults", "POST", chat, _chat("champion")),
        Exchange("stream-chat-champion", "POST", chat, _chat("champion", stream=True, **FIXED)),
        Exchange("stream-completion-pld-usage", "POST", completion,
                 _completion("pld", **usage, **FIXED)),
        Exchange("stream-chat-cascade-usage", "POST", chat, _chat("cascade", **usage),
                 exact=False),
        Exchange(
            "chat-pld-options", "POST", chat,
            _chat("pld", num_speculative_tokens=3, draft_policy="fixed", capture=False,
                  stop=["zz"], seed=7, top_k=0, top_p=1.0, user="u", store=False),
        ),
        Exchange("chat-pld-relaxed", "POST", chat, _chat("pld", relax_lambda=0.5, **FIXED)),
        Exchange("health", "GET", "/health"),
        Exchange("models", "GET", "/v1/models"),
        Exchange("error-drafter-with-files", "POST", chat, _chat("head:head")),
        Exchange("error-shared-ngram-store", "POST", chat, _chat("ngram:3,store=x.json")),
        Exchange("error-unknown-drafter", "POST", chat, _chat("warp")),
        Exchange("error-unknown-model", "POST", chat, {**_chat("pld"), "model": "other"}),
        Exchange("error-n", "POST", completion, _completion("pld", n=2)),
        Exchange("error-max-tokens", "POST", completion, _completion("pld", max_tokens=0)),
        Exchange("error-policy", "POST", chat, _chat("pld", draft_policy="fastest")),
        Exchange("error-k", "POST", chat, _chat("pld", num_speculative_tokens=0)),
        Exchange("error-empty-messages", "POST", chat, {**_chat("pld"), "messages": []}),
        Exchange("error-relaxed-sampling", "POST", chat,
                 _chat("pld", relax_lambda=0.5, temperature=0.7)),
        Exchange("error-skeleton-stream", "POST", chat, _chat("pld", skeleton=True, stream=True)),
        Exchange("error-not-json", "POST", chat, raw="{not json"),
    ]  # fmt: skip


def tiny_server_state(work: Path, packages: Path) -> Any:
    """The server's state on the tiny target with the real tokenizer (as the server tests
    build it), the champion served from a local pointer to a fixture package, the cascade
    configured, and every request captured (share 1) into ``work / "store"``."""
    from transformers import AutoTokenizer

    from serving.models.real import real_model_dir
    from serving.models.tiny import tiny_llama
    from serving.server.config import SERVING_CONFIG, load_server_config
    from serving.server.state import build_state

    pointer = write_json(
        work / "champion.json",
        {"package": str(packages / CHAMPION_PACKAGE), "version": CHAMPION_LABEL},
    )
    config = load_server_config(
        SERVING_CONFIG,
        **{
            "capture.store": str(work / "store"),
            "capture.share": 1.0,
            "limits.max_tokens": 64,
            "threads": 1,
            "champion.source": "local",
            "champion.path": str(pointer),
            "cascade.stages": CASCADE_STAGES,
        },
    )
    target = tiny_llama(vocab_size=49152, hidden_size=64, num_layers=2, seed=SEED)
    tokenizer = AutoTokenizer.from_pretrained(real_model_dir())
    return build_state(config, target=as_target(target, tokenizer))


def _response(response: Any) -> dict[str, JSON]:
    """Status, content type and body (a stream as its events, ``[DONE]`` included)."""
    kind = response.headers.get("content-type", "")
    answer: dict[str, JSON] = {"status": response.status_code, "content_type": kind}
    if kind.startswith("text/event-stream"):
        events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
        answer["events"] = [event if event == "[DONE]" else json.loads(event) for event in events]
    else:
        answer["body"] = response.json()
    return answer


def send(client: Any, exchange: Exchange) -> dict[str, JSON]:
    """``exchange`` sent through ``client`` (a FastAPI TestClient); its response."""
    if exchange.method == "GET":
        return _response(client.get(exchange.path))
    if exchange.raw is not None:
        headers = {"content-type": "application/json"}
        return _response(client.post(exchange.path, content=exchange.raw, headers=headers))
    return _response(client.post(exchange.path, json=exchange.body))


def metric_names(text: str) -> dict[str, JSON]:
    """The Prometheus exposition's families: type, and each sample's name with its label
    names (values are measurements)."""
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, JSON] = {}
    for family in text_string_to_metric_families(text):
        samples: dict[str, list[str]] = {}
        for sample in family.samples:
            labels = sorted(set(samples.get(sample.name, [])) | set(sample.labels))
            samples[sample.name] = labels
        families[family.name] = {"type": family.type, "samples": dict(sorted(samples.items()))}
    return dict(sorted(families.items()))


def normalise_http(value: JSON, roots: Mapping[Path, str]) -> JSON:
    """Answer ids ``<id>``, moments 0, paths as placeholders."""

    def fix(text: str) -> str:
        return re.sub(r"^(chatcmpl|cmpl)-[0-9a-f]{32}$", r"\1-<id>", text)

    return normalise_paths(map_strings(normalise_timings(value), fix), roots)


def captured_records(store: Path) -> list[JSON]:
    """The records the server captured, in the order written, with the store-relative
    part file each is in (names normalised: run id, date)."""
    from serving.records.store import read_raw

    rows = []
    for source, row in read_raw(store):
        if isinstance(row, dict):
            rows.append({"part": source, **row})
    rows.sort(key=lambda row: row.get("timestamp", 0.0))
    return rows


def record_is_exact(record: JSON) -> bool:
    """A record of a request that drafted under a fixed policy (or not at all): the same
    on every run."""
    return record.get("policy") in ("fixed", "none")


def normalise_records(rows: list[JSON], roots: Mapping[Path, str]) -> list[JSON]:
    """Record ids (a hash of the run id) ``<id>``, the capture run id ``<run>``, the
    partition's date ``<date>``, the part's number and line ``<n>`` (a part is written
    every 8 records or 30 s, whichever comes first), timestamps 0."""
    out = []
    for row in rows:
        run_id = row.get("run_id", "")
        fixed = {**row, "id": "<id>", "run_id": "<run>"}
        part = re.sub(r"date=[0-9-]+", "date=<date>", str(row["part"]).replace(run_id, "<run>"))
        fixed["part"] = re.sub(r"-\d+\.jsonl:\d+$", "-<n>.jsonl", part)
        out.append(fixed)
    return normalise_paths(normalise_timings(out), roots)


def build_http(work: Path, packages: Path) -> dict[str, JSON]:
    """Every exchange's request and response, the metrics' names, and the captured
    records, normalised: ``{"exchanges": {name: {...}}, "metrics": ..., "records": ...}``."""
    from fastapi.testclient import TestClient

    from serving.server.app import create_app

    roots = {packages.parent: "<fixtures>", work: "<work>"}
    with torch_threads(1):  # the server sets its own (serving.yaml's threads: 1)
        state = tiny_server_state(work, packages)
        with TestClient(create_app(state)) as client:
            exchanges = {
                e.name: {"request": e.request(), "response": send(client, e)}
                for e in http_exchanges()
            }
            metrics = metric_names(client.get("/metrics").text)
    return {
        "exchanges": normalise_http(exchanges, roots),
        "metrics": metrics,
        "records": normalise_records(captured_records(work / "store"), roots),
    }


def write_http(out: Path, built: Mapping[str, JSON]) -> None:
    """``http/<exchange>.json``, ``http/metrics.json`` and ``http/captured-records.json``
    (a folder replaced whole, so a renamed exchange leaves no stale file)."""
    with scratch_dir("http") as folder:
        for name, exchange in built["exchanges"].items():
            write_json(folder / f"{name}.json", exchange)
        write_json(folder / "metrics.json", built["metrics"])
        write_json(folder / "captured-records.json", built["records"])
        if "describe" in built:
            write_json(folder / "describe.json", built["describe"])
        install_folder(folder, out / "http")


# ------------------------------------------------------------------------------ describe

DESCRIBED_SPECS = ("none", "pld", "pld:2", "ngram", "ngram:3,fallback=target,min_conf=0.1",
                   "layers:2")  # fmt: skip


def _described(target: Any, plan: Any, drafter: Any, **options: Any) -> JSON:
    from serving.engine.build import build_decoder

    return build_decoder(target, plan, drafter=drafter, **options).describe()


def build_describe(packages: Path) -> dict[str, JSON]:
    """What ``SpeculativeDecoder.describe()`` reports (what records and responses carry as
    the drafter and policy) for a decoder of every package fixture, every built-in spec,
    the cascade, and a relaxed decoder, on the tiny target."""
    from serving.engine.cascade.build import build_cascade
    from serving.engine.drafters.factory import build_drafter
    from serving.engine.drafters.package import load_package
    from serving.engine.drafters.plan import CascadePlan, DraftPlan
    from serving.models.tiny import tiny_llama

    target = as_target(tiny_llama(seed=SEED), char_tokenizer())
    described: dict[str, JSON] = {}
    for kind in PACKAGE_KINDS:
        manifest, drafter = load_package(packages / kind, target)
        plan = manifest.plan(packages / kind)
        described[f"package:{kind}"] = _described(target, plan, drafter)
    for spec in DESCRIBED_SPECS:
        plan = DraftPlan.parse(spec)  # the cost policy, k 10
        described[f"spec:{spec}"] = _described(target, plan, build_drafter(plan.drafter, target))
    cascade = CascadePlan.parse(CASCADE_STAGES)
    described[f"cascade:{CASCADE_STAGES}"] = _described(
        target, cascade, build_cascade(cascade, target)
    )
    pld = DraftPlan.parse("pld")
    described["relaxed:pld"] = _described(
        target, pld, build_drafter(pld.drafter, target), relax_lambda=0.5
    )
    return normalise_paths(normalise_timings(described), {packages.parent: "<fixtures>"})


# ----------------------------------------------------------------------------------- kit

ZERO_SHA256 = "0" * 64


def build_kit_fixture(
    world: TinyWorld, packages: Path, *, tracking_uri: str | None = None
) -> dict[str, JSON]:
    """A GPU run kit built as ``specops gpu kit`` builds it (:func:`tasks.gpu.kit.build_kit`:
    no wheels, the tiny target's folder as the model) from a bundle
    (:func:`tasks.loop.remote_bundle.prepare_bundle`) of the pld package registered in a
    fresh registry; its ``kit.json`` and the bundle's ``request.json`` and
    ``prompts.json``, normalised."""
    from registry.client import Registry
    from serving.hardware import engine_target
    from tasks.gpu.kit import KitOptions, build_kit
    from tasks.loop.remote_bundle import PROMPTS, REQUEST, prepare_bundle

    work = world.work / "kit"
    work.mkdir(parents=True, exist_ok=True)
    with registry_environment(work, tracking_uri):
        registry = Registry()
        draft = registry.log_draft(packages / "pld", family="ngram")
        bundle = prepare_bundle(
            registry, engine_target(HARDWARE), [draft], text_prompts(2), work / "bundle",
            tokenizer=world.tokenizer, cache=work / "cache", max_new_tokens=EVALUATION_NEW_TOKENS,
        )  # fmt: skip
    options = KitOptions(out=work / "kit", bundle=bundle, target=str(world.folder), wheels=False)
    manifest = build_kit(options, say=lambda line: None)
    return {
        "kit.json": normalise_kit(manifest.to_dict()),
        REQUEST: read_json(bundle / REQUEST),
        PROMPTS: read_json(bundle / PROMPTS),
    }


def normalise_kit(manifest: dict[str, JSON]) -> dict[str, JSON]:
    """The build time (the epoch), the commit (``<commit>``), and the size and sha256 of
    each archive (the checkout's code, the model folder's and the bundle's tars: their
    bytes vary with the checkout and with file times) as 0 and 64 zeros, values of the
    right type, so that the reader still takes the manifest; part names and counts kept."""
    fixed = json.loads(json.dumps(manifest))
    fixed["created"] = EPOCH_ISO
    fixed["commit"] = "<commit>"
    for entry in fixed["files"].values():
        entry.update(bytes=0, sha256=ZERO_SHA256)
        for part in entry["parts"]:
            part.update(bytes=0, sha256=ZERO_SHA256)
    return fixed


def write_kit(out: Path, built: Mapping[str, JSON]) -> None:
    from tasks.loop.remote_bundle import PROMPTS, REQUEST

    write_json(out / "kit-manifest.json", built["kit.json"])
    with scratch_dir("bundle") as folder:
        write_json(folder / REQUEST, built[REQUEST])
        write_json(folder / PROMPTS, built[PROMPTS])
        install_folder(folder, out / "kit-bundle")


# --------------------------------------------------------------------------------- bench

BENCH_ARGS = ("--prompts", "2", "--max-new-tokens", "64", "--threads", "2")
BENCH_SETTINGS = {"prompts_per_workload": 2, "max_new_tokens": 64, "threads": 2}


def run_bench(out: Path) -> Path:
    """``specops bench --prompts 2 --max-new-tokens 64 --threads 2 --out OUT`` in a process
    of its own (it loads the shipped SmolLM2-135M: minutes); its ``bench.json``."""
    import subprocess

    command = [sys.executable, "-m", "specops", "bench", *BENCH_ARGS, "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-3000:]}")
    return out / "bench.json"


BENCH_CONFIG_KEYS = ("workloads", "split", "seed", "hardware", "draft_layers", *BENCH_SETTINGS)


def bench_config(config: Mapping[str, JSON]) -> dict[str, JSON]:
    """The settings that decide the bench's token ids, and each method as configured (its
    unset options left out), from a bench config dumped to JSON."""
    return {
        "settings": {key: config[key] for key in BENCH_CONFIG_KEYS},
        "methods": [
            {key: value for key, value in method.items() if value is not None}
            for method in config["methods"]
        ],
    }


def bench_token_ids(results: JSON) -> dict[str, JSON]:
    """From a bench.json of that command: per method and prompt, the generated token ids
    (the ``runs``' ``token_ids``; timings and the machine left out), with the prompts, each
    method's reference and whether it matched it."""
    config = results["config"]
    wrong = {k: config.get(k) for k, v in BENCH_SETTINGS.items() if config.get(k) != v}
    if wrong:
        command = f"specops bench {' '.join(BENCH_ARGS)}"
        raise ValueError(f"bench.json was not made by `{command}`: its settings {wrong} differ")
    methods: dict[str, dict[str, list[int]]] = {}
    identical: dict[str, dict[str, bool]] = {}
    prompts: dict[str, JSON] = {}
    for run in results["runs"]:
        methods.setdefault(run["method"], {})[run["prompt_id"]] = run["token_ids"]
        identical.setdefault(run["method"], {})[run["prompt_id"]] = run["identical"]
        prompts[run["prompt_id"]] = {"workload": run["workload"], "tokens": run["prompt_tokens"]}
    return {
        "command": f"specops bench {' '.join(BENCH_ARGS)}",
        "config": bench_config(config),
        "prompts": prompts,
        "references": results["references"],
        "identical": identical,
        "token_ids": methods,
    }


# ---------------------------------------------------------------------------------- main


@dataclass
class Run:
    """One generation: where the fixtures go, the scratch folder, the tiny world (None
    when no part needs it), the packages built so far, and a bench.json to reuse."""

    out: Path
    work: Path
    world: TinyWorld | None
    bench_json: Path | None = None
    built: dict[str, BuiltPackage] | None = None

    def needs(self, *names: str) -> None:
        """Fail naming the fixture a part reads when an earlier part has not written it."""
        missing = [name for name in names if not (self.out / name).exists()]
        if missing:
            raise FileNotFoundError(
                f"{', '.join(str(self.out / name) for name in missing)} missing: generate "
                "it first (--only packages, evaluation: the parts in the order of --help)"
            )

    def tiny(self) -> TinyWorld:
        assert self.world is not None, "the tiny world is built for every part that needs it"
        return self.world


def _packages(run: Run) -> None:
    run.built = build_packages(run.tiny())
    write_packages(run.out, run.built)


def _teacher(run: Run) -> None:
    write_json(run.out / "teacher-manifest.json", build_teacher_manifest(run.tiny()))


def _evaluation(run: Run) -> None:
    run.needs("packages")
    write_evaluation(run.out / "evaluation.json", build_evaluation(run.out / "packages"))


def _mlflow(run: Run) -> None:
    run.needs("evaluation.json")
    trained = run.built or build_packages(run.tiny(), ("pld", "head", "lora"))
    evaluation = run.out / "evaluation.json"
    write_json(run.out / "mlflow.json", build_mlflow(run.tiny(), trained, evaluation))


def _http(run: Run) -> None:
    run.needs("packages")
    (run.work / "http").mkdir()
    http = build_http(run.work / "http", run.out / "packages")
    write_http(run.out, {**http, "describe": build_describe(run.out / "packages")})


def _kit(run: Run) -> None:
    run.needs("packages")
    write_kit(run.out, build_kit_fixture(run.tiny(), run.out / "packages"))


def _bench(run: Run) -> None:
    source = run.bench_json or run_bench(run.work / "bench")
    write_json(run.out / "bench-token-ids.json", bench_token_ids(read_json(source)))


PART_WRITERS: dict[str, Callable[[Run], None]] = {
    "packages": _packages,
    "teacher": _teacher,
    "evaluation": _evaluation,
    "mlflow": _mlflow,
    "http": _http,
    "kit": _kit,
    "bench": _bench,
}
NEEDS_WORLD = frozenset({"packages", "teacher", "mlflow", "kit"})


def generate(out: Path, parts: Sequence[str], *, bench_json: Path | None = None) -> None:
    """Write the fixtures of ``parts`` (in :data:`PARTS`' order) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with scratch_dir("work") as work:
        world = tiny_world(work) if NEEDS_WORLD & set(parts) else None
        run = Run(out, work, world, bench_json)
        for part in PARTS:
            if part in parts:
                PART_WRITERS[part](run)


def parse_parts(text: str) -> list[str]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        raise argparse.ArgumentTypeError(
            f"--only {text!r}: unknown parts {unknown}; choose from {', '.join(PARTS)}"
        )
    return [part for part in PARTS if part in parts]  # in dependency order


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="the fixtures folder (default: %(default)s)"
    )
    parser.add_argument(
        "--only",
        type=parse_parts,
        default=list(PARTS),
        help=f"comma-separated parts, from: {', '.join(PARTS)} (default: all)",
    )
    parser.add_argument(
        "--bench-json",
        type=Path,
        help="take the bench token ids from this bench.json of the same command instead of "
        "running it",
    )
    args = parser.parse_args(argv)
    generate(args.out.resolve(), args.only, bench_json=args.bench_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
