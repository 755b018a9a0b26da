"""The app in-process on the tiny random target with the real tokenizer (the fast tier's
server): FastAPI's TestClient, lifespan included, so requests go through the scheduler as
in `specops serve`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from fastapi.testclient import TestClient

from serving.server.app import create_app
from serving.server.config import load_server_config
from serving.server.state import ServerState, build_state
from tests.serving.server.served import served_target


@pytest.fixture(scope="module")
def tiny_state(model_folder, tmp_path_factory) -> Iterator[ServerState]:
    from transformers import AutoTokenizer

    from serving.models.tiny import tiny_llama

    # The weights model_folder saved, rebuilt in memory (same seed, same shape).
    model = tiny_llama(vocab_size=49152, hidden_size=64, num_layers=2)
    target = served_target(model, AutoTokenizer.from_pretrained(model_folder))
    config = load_server_config(
        **{
            "capture.store": str(tmp_path_factory.mktemp("store")),
            "limits.max_tokens": 64,
            "threads": 1,
        }
    )
    threads = torch.get_num_threads()  # build_state sets the server's; the suite's come back
    try:
        yield build_state(config, target=target)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_client(tiny_state):
    with TestClient(create_app(tiny_state)) as client:
        yield client
