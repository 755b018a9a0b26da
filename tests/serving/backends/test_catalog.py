"""The backend interface in the main environment: speculation checks, counting from
draft flags, and the errors for unknown, unsupported and uninstalled backends."""

from __future__ import annotations

import importlib.util

import pytest

from serving.backends import (
    BackendUnavailableError,
    Speculation,
    UnsupportedDraftError,
    open_backend,
)
from serving.backends.base import checks_from_flags
from serving.errors import BadInputError


def test_speculation_is_checked():
    with pytest.raises(BadInputError, match="'eagle'"):
        Speculation("eagle", 3)  # type: ignore[arg-type]
    with pytest.raises(BadInputError, match="num_speculative_tokens"):
        Speculation("ngram", 0)
    with pytest.raises(BadInputError, match="draft_path"):
        Speculation("draft_model", 3)
    with pytest.raises(BadInputError, match="bad speculation"):
        Speculation.from_dict({"method": "ngram", "k": 3})
    assert Speculation.from_dict(Speculation("ngram", 4).to_dict()) == Speculation("ngram", 4)


def test_counts_follow_from_draft_flags():
    # passes: [T T F] [F] [T F] [T T] (the budget cut the last one)
    counts = checks_from_flags([True, True, False, False, True, False, True, True], k=3)
    assert counts.checks == 4
    assert counts.accepted_tokens == 5
    assert counts.draft_tokens == 12
    assert counts.kept_by_position == [3, 2, 0]
    assert counts.reached_by_position == [4, 4, 4]


def test_unknown_backend_and_unsupported_draft_fail_before_loading(tmp_path):
    with pytest.raises(BadInputError, match="unknown backend 'tpu'"):
        open_backend("tpu", str(tmp_path), Speculation())
    with pytest.raises(UnsupportedDraftError, match="backend 'mlx' cannot draft with 'ngram'"):
        open_backend("mlx", str(tmp_path), Speculation("ngram", 3))


@pytest.mark.parametrize(
    ("backend", "command"),
    [
        ("vllm", "setup_backend.sh vllm"),
        ("mlx", "setup_backend.sh mlx"),
        ("neuron", "pip.repos.neuron.amazonaws.com"),
    ],
)
def test_a_missing_backend_names_its_extra(monkeypatch, tmp_path, backend, command):
    real = importlib.util.find_spec
    hidden = ("vllm", "mlx", "mlx_lm", "transformers_neuronx")

    def find_spec(name, *args):
        return None if name.split(".")[0] in hidden else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(BackendUnavailableError, match=command):
        open_backend(backend, str(tmp_path), Speculation())


@pytest.mark.real_model
def test_transformers_backend_reproduces_greedy(tmp_path, model_folder, prompt):
    (tmp_path / "target").symlink_to(model_folder)
    plain = open_backend("transformers", str(tmp_path / "target"), Speculation(), kernels="stock")
    lookup = open_backend(
        "transformers", str(tmp_path / "target"), Speculation("ngram", 3), kernels="stock"
    )
    self_draft = open_backend(
        "transformers",
        str(tmp_path / "target"),
        Speculation("draft_model", 3, draft_path=str(tmp_path / "target")),
        kernels="stock",
    )
    reference = plain.generate(prompt, 24)
    assert reference.accepted_tokens == 0 and reference.checks == len(reference.token_ids)
    for backend in (lookup, self_draft):
        out = backend.generate(prompt, 24)
        assert out.token_ids == reference.token_ids
    drafted = self_draft.generate(prompt, 24)
    assert drafted.accepted_tokens / drafted.draft_tokens > 0.9
