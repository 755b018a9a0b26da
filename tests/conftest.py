"""Shared fixtures: one tiny random target model and a prompt, built once per session.

Tests must not change the target's weights; drafts built from it (``first_layers``) share
its modules, which is fine because nothing here trains.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
import torch

from serving.models.tiny import tiny_llama
from tasks.data.prompts import Prompt

# Under pytest-xdist (scripts/test.sh runs one worker per core) each worker's torch takes
# one core: two threads in each of two workers would fight over two cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

# Repeats a few n-grams so that prompt lookup and the n-gram store find something to draft.
PROMPT = [1, 5, 17, 42, 8, 5, 17, 42, 33, 9, 5, 17]
NEW_TOKENS = 48


def pytest_addoption(parser):
    parser.addoption(
        "--collected-ids",
        metavar="PATH",
        help="write every collected test id to PATH, before -m/-k deselect any "
        "(scripts/check_test_ids.py compares them with tests/test-ids.txt)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    path = config.getoption("--collected-ids")
    # Under pytest-xdist every worker collects the same items: the first one writes them.
    if path and os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text("".join(f"{item.nodeid}\n" for item in items))
    # A benchmark command run end to end (minutes of the real model) is the check of a
    # refactor's "same token ids", run on demand with -m benchmark, not in the test command.
    if "benchmark" not in (config.getoption("markexpr") or ""):
        benchmarks = [item for item in items if item.get_closest_marker("benchmark")]
        if benchmarks:
            config.hook.pytest_deselected(items=benchmarks)
            items[:] = [item for item in items if not item.get_closest_marker("benchmark")]
    # The longest module first, so that under pytest-xdist the other worker runs the rest
    # beside it instead of one worker finishing it alone at the end. Only one: the team
    # stack and the DVC pipeline side by side (both start many processes) each ran far
    # slower than beside the lighter tests.
    items.sort(key=lambda item: item.nodeid.split("::")[0] != LONGEST)


# ~7 min on two cores (docs/test-durations.md).
LONGEST = "tests/tasks/ops/test_team_stack_e2e.py"


# The registry's settings from the environment (docs/configuration.md). A developer's shell
# may hold them; the suite must never reach a real tracking server through them.
REGISTRY_ENV = (
    "MLFLOW_TRACKING_URI",
    "MLFLOW_REGISTRY_URI",
    "SPECOPS_MLFLOW_URI",
    "SPECOPS_MLFLOW_ARTIFACTS",
    "SPECOPS_REGISTRY_CONFIG",
)


@pytest.fixture(scope="session", autouse=True)
def no_ambient_registry():
    """Unset for the whole session (module and session fixtures included)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        for name in REGISTRY_ENV:
            monkeypatch.delenv(name, raising=False)
        yield


@pytest.fixture(autouse=True)
def registry_settings_per_test(monkeypatch):
    """What a test sets (variables, ``specops --tracking-uri ...``, whose overrides are
    exported to the environment) ends with it."""
    import registry.config as registry_config

    for name in REGISTRY_ENV:
        monkeypatch.setenv(name, "")  # records the value to restore after the test
        monkeypatch.delenv(name)
    monkeypatch.setattr(registry_config, "_overrides", registry_config.Overrides())
    monkeypatch.setattr(registry_config, "_exported", {})


@pytest.fixture(scope="session")
def target():
    return tiny_llama()


@pytest.fixture(scope="session")
def prompt() -> list[int]:
    return list(PROMPT)


@pytest.fixture(scope="session")
def greedy_reference(target, prompt) -> list[int]:
    """Hugging Face's own greedy continuation (no EOS stop) of ``prompt``."""
    with torch.inference_mode():
        input_ids = torch.tensor([prompt])
        out = target.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


# --- The shipped SmolLM2-135M-Instruct (tests marked real_model) ---------------------------
# The first use converts the package's GGUF into the specops cache (~25 s, once per machine);
# later sessions reload the safetensors folder in about a second.
PROMPTS = [
    "Rewrite the following sentence with correct grammar, changing nothing else: "
    "'The results of the experiment was surprising, because the team have expected "
    "the opposite outcome for many month.'",
    "Write a Python function that returns the n-th Fibonacci number.",
]


@pytest.fixture(scope="session")
def real_stock():
    """The real target (a :class:`serving.target.LoadedTarget`) on hardware target
    ``cpu-stock``: torch's own layers, transformers' forward."""
    from serving.hardware import engine_target
    from serving.loader import load_target
    from serving.target import DEFAULT_TARGET

    return load_target(DEFAULT_TARGET, engine_target("cpu-stock"))


@pytest.fixture(scope="session")
def real_packed():
    """The real target on hardware target ``cpu``: oneDNN-packed layers, the lean step."""
    from serving.hardware import engine_target
    from serving.loader import load_target
    from serving.target import DEFAULT_TARGET

    return load_target(DEFAULT_TARGET, engine_target("cpu"))


@pytest.fixture(scope="session")
def real_prompts(real_stock) -> list[list[int]]:
    from serving.loader import encode_prompt

    return [encode_prompt(real_stock.tokenizer, text) for text in PROMPTS]


# --- Text traffic for the tiny target (data, collection, evaluation and flow tests) ------
FIRST_TEXT_ID = 3  # ids 0-2 are pad, BOS and EOS in the tiny target


class CharTokenizer:
    """One token per printable ASCII character, ids 3..95 (the tiny target's vocab is 96).

    What collection calls on a tokenizer without a chat template: ``chat_template``,
    ``tokenizer(text, add_special_tokens=False)["input_ids"]`` and ``decode``.
    """

    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [FIRST_TEXT_ID + (ord(c) - 32) % 93 for c in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(
            chr(32 + token - FIRST_TEXT_ID)
            for token in ids
            if token >= FIRST_TEXT_ID or not skip_special_tokens
        )

    def save_pretrained(self, folder) -> None:
        """Nothing to write: a draft saved beside it loads without a tokenizer file (the
        vocabulary-size check still runs)."""


# Short texts with repeats, so that prompt lookup finds something to draft.
TEXTS = [
    "abc abc abc abc",
    "the cat sat on the mat; the cat",
    "hello hello hello",
    "1212121212",
    "fix: teh teh teh",
    "aaaa bbbb aaaa bbbb",
]


def _prompts(texts: list[str] = TEXTS, *, workload: str = "grounded") -> list[Prompt]:
    """Prompts ``p0, p1, ...``; every third one is held out."""
    return [
        Prompt(
            id=f"p{i}",
            workload=workload,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": text}],
            reference=None,
            split="heldout" if i % 3 == 2 else "train",
        )
        for i, text in enumerate(texts)
    ]


def _build_tiny_teacher_cache(
    target, path, *, prompts: int, prompt_len: int, max_new_tokens: int, seed: int, prefix: str
) -> None:
    from tasks.train.teacher import TeacherConfig
    from tasks.train.teacher_build import TeacherPrompt, build_teacher_cache

    generator = torch.Generator().manual_seed(seed)
    chosen = [
        TeacherPrompt(
            f"{prefix}{i}", torch.randint(3, 96, (prompt_len,), generator=generator).tolist()
        )
        for i in range(prompts)
    ]
    config = TeacherConfig(max_new_tokens=max_new_tokens)
    build_teacher_cache(target, chosen, path, eos_token_ids=[2], config=config, progress=False)


@pytest.fixture(scope="session")
def tiny_teacher_cache(tmp_path_factory):
    """``tiny_teacher_cache(target, path, prompts=, prompt_len=, max_new_tokens=, seed=,
    prefix="p")``: the tiny target's greedy answers to random prompts (ids ``p0, p1, ...``)
    as a teacher cache at ``path``, the training data of the trainer tests.

    Each set of arguments is built once per session (the same seed gives the same prompts,
    the same target the same answers) and copied to ``path``, so a test may change its copy.
    """
    built: dict[tuple, tuple[object, Path]] = {}

    def make(
        target, path, *, prompts: int, prompt_len: int, max_new_tokens: int, seed: int,
        prefix: str = "p",
    ):  # fmt: skip
        key = (id(target), prompts, prompt_len, max_new_tokens, seed, prefix)
        if key not in built or built[key][0] is not target:
            folder = tmp_path_factory.mktemp("teacher-cache")
            _build_tiny_teacher_cache(
                target, folder, prompts=prompts, prompt_len=prompt_len,
                max_new_tokens=max_new_tokens, seed=seed, prefix=prefix,
            )  # fmt: skip
            built[key] = (target, folder)  # the target is kept, so its id stays its own
        shutil.copytree(built[key][1], path, dirs_exist_ok=True)
        return path

    return make


def _write_lora_adapter(target, folder: Path, *, layers: int = 2, seed: int = 0) -> Path:
    """A peft adapter over ``target``'s first ``layers`` layers, as a LoRA run saves it
    (with its ``lora_base.json``), with random (not zero) updates so that merging it
    changes every adapted weight; no training."""
    from serving.models.lora import lora_base_of, write_lora_base
    from tasks.train.distill_model import base_draft, with_lora

    torch.manual_seed(seed)
    base = base_draft(target, layers=layers, draft_model=None)
    adapted = with_lora(base, r=4, alpha=8, dropout=0.0, target_modules="all-linear")
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.2)
    adapted.save_pretrained(folder)
    write_lora_base(folder, lora_base_of(target, layers))
    return folder


@pytest.fixture(scope="session")
def lora_adapter():
    """``lora_adapter(target, folder, layers=2, seed=0)``: write a random LoRA adapter over
    ``target``'s first layers into ``folder`` (the layout a LoRA package stores)."""
    return _write_lora_adapter


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread, and far slower on two on a busy machine;
    modules that train them use it (``pytestmark = pytest.mark.usefixtures(...)``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def char_tokenizer() -> CharTokenizer:
    return CharTokenizer()


@pytest.fixture(scope="session")
def make_prompts():
    """``make_prompts(texts=TEXTS, workload="grounded")``: traffic for the tiny target."""
    return _prompts


@pytest.fixture(scope="session")
def model_folder(tmp_path_factory):
    """A tiny random Llama with the real tokenizer: a folder any backend can load."""
    from transformers import AutoTokenizer

    from serving.models.real import real_model_dir
    from serving.models.tiny import tiny_llama

    folder = tmp_path_factory.mktemp("tiny") / "target"
    tiny_llama(vocab_size=49152, hidden_size=64, num_layers=2).save_pretrained(folder)
    AutoTokenizer.from_pretrained(real_model_dir()).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def long_context_folder(tmp_path_factory):
    """As ``model_folder``, with room (4096 positions) for real grounded prompts."""
    from transformers import AutoTokenizer

    from serving.models.real import real_model_dir
    from serving.models.tiny import tiny_llama

    folder = tmp_path_factory.mktemp("tiny-long") / "target"
    model = tiny_llama(vocab_size=49152, hidden_size=64, num_layers=2, max_positions=4096)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(real_model_dir()).save_pretrained(folder)
    return folder


# --- MLflow stores and the Prefect server: made once per session ---------------------------
@pytest.fixture(scope="session")
def migrated_mlflow_db(tmp_path_factory) -> Path:
    """An empty SQLite MLflow store, migrated once per session (MLflow's migrations take
    5-10 s per new store). Its Default experiment is deleted, so a copy's first open creates
    it under that store's own artifact root, as in a store made from nothing."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    folder = tmp_path_factory.mktemp("mlflow-template")
    path = folder / "mlflow.db"
    SqlAlchemyStore(f"sqlite:///{path}", str(folder / "artifacts")).engine.dispose()
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("DELETE FROM experiments")
    return path


@pytest.fixture(scope="session")
def new_mlflow_store(migrated_mlflow_db):
    """``new_mlflow_store(path) -> URI``: an empty, migrated SQLite MLflow store at ``path``
    (a copy of the session's), as ``sqlite:///path``."""

    def make(path: Path) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(migrated_mlflow_db, path)
        return f"sqlite:///{path}"

    return make


@pytest.fixture
def mlflow_uri(tmp_path, new_mlflow_store) -> str:
    """A fresh store at ``tmp_path / "mlflow.db"``: point ``SPECOPS_MLFLOW_URI`` (or a
    ``RegistryConfig``) at this instead of at a new file."""
    return new_mlflow_store(tmp_path / "mlflow.db")


@pytest.fixture
def registry(tmp_path, mlflow_uri):
    """A fresh MLflow registry (SQLite and artifacts in the test's temporary folder, model
    prefix ``t``); a test module may define its own."""
    from registry.client import Registry
    from registry.config import RegistryConfig

    return Registry(
        RegistryConfig(
            tracking_uri=mlflow_uri, artifact_root=str(tmp_path / "artifacts"), model_prefix="t"
        )
    )


@pytest.fixture(scope="session")
def prefect_harness():
    """One Prefect test server (SQLite in a temporary folder) for the whole session: starting
    one takes ~20 s, and two must never run at once. Yields its API URL; the tests using it
    share its database, so each names what it creates."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield PREFECT_API_URL.value()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory):
    """A CA, and a server certificate it signed for loopback, made for the session
    (tests/tls_certs.py)."""
    from tests.tls_certs import make_tls_files

    return make_tls_files(tmp_path_factory.mktemp("tls"))
