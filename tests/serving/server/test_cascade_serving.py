"""The server's cascade on the real model: lossless by default, relaxed on request (its
kept disagreements reported), bad λ refused; a damaged predictor leaves it serving."""

import pytest
from fastapi.testclient import TestClient

from serving.engine.build import build_decoder
from serving.server.app import create_app
from serving.server.config import load_server_config
from serving.server.state import build_state
from tests.serving.engine.cascade.conftest import tiny_predictor

pytestmark = pytest.mark.real_model

QUESTION = "List the numbers from one to ten, then from ten to one."


def _client(real_packed, tmp_path, predictor_path):
    config = load_server_config(
        **{
            "capture.store": str(tmp_path / "store"),
            "limits.max_tokens": 64,
            "cascade.stages": "suffix,pld:3",
            "cascade.predictor": "local",
            "cascade.predictor_path": str(predictor_path),
        }
    )
    return TestClient(create_app(build_state(config, target=real_packed)))


def _chat(client, **fields):
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": 48,
        "temperature": 0,
        "drafter": "cascade",
        **fields,
    }
    return client.post("/v1/chat/completions", json=body)


def _greedy(real_packed, n):
    tokenizer = real_packed.tokenizer
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=True
    )
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    plain = build_decoder(real_packed)  # stops at the target's end-of-sequence ids
    return tokenizer.decode(
        plain.generate(ids, max_new_tokens=n).token_ids, skip_special_tokens=True
    )


def test_cascade_serves_losslessly_and_relaxed_on_request(real_packed, tmp_path):
    predictor = tiny_predictor().save(tmp_path / "predictor")
    with _client(real_packed, tmp_path, predictor) as client:
        response = _chat(client)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["choices"][0]["message"]["content"] == _greedy(real_packed, 48)
        speculative = body["usage"]["speculative"]
        assert speculative["draft_version"].startswith("cascade:")
        assert "predictor:local" in speculative["draft_version"]
        assert speculative["unverified_positions"] == []

        relaxed = _chat(client, relax_lambda=0.001)
        assert relaxed.status_code == 200, relaxed.text
        assert isinstance(relaxed.json()["usage"]["speculative"]["unverified_positions"], list)

        refused = _chat(client, relax_lambda=0)
        assert refused.status_code == 400 and "λ must be in" in refused.text
        sampled = _chat(client, relax_lambda=1.0, temperature=0.7)
        assert sampled.status_code == 400 and "greedy" in sampled.text


def test_a_damaged_predictor_leaves_the_cascade_serving(real_packed, tmp_path):
    folder = tiny_predictor().save(tmp_path / "predictor")
    (folder / "predictor.safetensors").write_bytes(b"not weights")
    with _client(real_packed, tmp_path, folder) as client:
        response = _chat(client)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == _greedy(real_packed, 48)
        assert "predictor" not in response.json()["usage"]["speculative"]["draft_version"]
