"""The server's wire (tests/fixtures/contracts/http/): request and response bodies of
every endpoint for every ``drafter`` a request may name, streams, errors, /health,
/v1/models, the metrics' names, the records the server captures, and what
``describe()`` reports for every drafter kind. Today's schemas take the stored requests
and today's response models the stored answers; today's server, rebuilt on the same tiny
target, answers with the same names (and, where nothing follows measured times, the
same bodies)."""

from __future__ import annotations

import pytest

from serving.records.schema import parse_record
from serving.server.responses import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChunk,
    Health,
    ModelList,
    UsageChunk,
)
from serving.server.schemas import HTTP_DRAFTERS, ChatCompletionRequest, CompletionRequest
from tests.fixtures.cpu_kind import require_recorded_cpu_kind

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py

REQUESTS = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest}
ANSWERS = {"/v1/completions": Completion, "/v1/chat/completions": ChatCompletion}
CHUNKS = {"/v1/completions": CompletionChunk, "/v1/chat/completions": ChatCompletionChunk}
OTHERS = {"/health": Health, "/v1/models": ModelList}


@pytest.fixture(scope="module")
def stored(fixtures, gen):
    """Every stored exchange, by name; the generator's list of them and the files agree
    (a fixture missing or left over fails here)."""
    names = [exchange.name for exchange in gen.http_exchanges()]
    others = ("metrics", "captured-records", "describe")
    files = {path.stem for path in (fixtures / "http").glob("*.json") if path.stem not in others}
    assert files == set(names)
    return {name: gen.read_json(fixtures / "http" / f"{name}.json") for name in names}


@pytest.fixture(scope="module")
def rebuilt(gen, fixtures, tmp_path_factory):
    """Today's server on the same tiny target: the same requests sent, normalised."""
    return gen.build_http(tmp_path_factory.mktemp("http"), fixtures / "packages")


def test_every_drafter_a_request_may_name_was_sent(gen):
    sent = {d.partition(":")[0] for d in gen.SENT_DRAFTERS}
    assert sent == set(HTTP_DRAFTERS)


def test_todays_schemas_take_the_stored_requests(stored):
    for name, exchange in stored.items():
        request, status = exchange["request"], exchange["response"]["status"]
        if request["method"] != "POST" or status != 200:
            continue
        parsed = REQUESTS[request["path"]].model_validate(request["body"])
        assert parsed.drafter == request["body"]["drafter"], name


def test_todays_response_models_take_the_stored_answers(stored):
    for name, exchange in stored.items():
        path, response = exchange["request"]["path"], exchange["response"]
        if response["status"] != 200:
            assert set(response["body"]) == {"error"}, name
            assert set(response["body"]["error"]) == {"message", "type", "param", "code"}
        elif path in OTHERS:
            OTHERS[path].model_validate(response["body"])
        elif "events" in response:
            assert response["events"][-1] == "[DONE]", name
            for event in response["events"][:-1]:
                model = UsageChunk if "usage" in event else CHUNKS[path]
                model.model_validate(event)
        else:
            ANSWERS[path].model_validate(response["body"])


def test_todays_record_reader_takes_the_captured_records(fixtures, gen):
    records = gen.read_json(fixtures / "http" / "captured-records.json")
    assert records
    for row in records:
        parse_record({key: value for key, value in row.items() if key != "part"})


def test_todays_server_answers_with_the_same_names(rebuilt, stored, gen):
    assert set(rebuilt["exchanges"]) == set(stored)
    for name, exchange in stored.items():
        names = gen.name_paths(rebuilt["exchanges"][name])
        assert names == gen.name_paths(exchange), name


def test_todays_server_answers_the_same(rebuilt, stored, gen):
    require_recorded_cpu_kind()
    exact = {exchange.name for exchange in gen.http_exchanges() if exchange.exact}
    for name in sorted(exact):
        assert rebuilt["exchanges"][name] == stored[name], name


def test_todays_server_exposes_the_same_metrics(rebuilt, fixtures, gen):
    assert rebuilt["metrics"] == gen.read_json(fixtures / "http" / "metrics.json")


def test_todays_server_captures_the_same_records(rebuilt, fixtures, gen):
    stored = gen.read_json(fixtures / "http" / "captured-records.json")
    # Keys only: which stage a cascade drafted with follows measured times.
    names = gen.name_paths(rebuilt["records"], values=False)
    assert names == gen.name_paths(stored, values=False)
    require_recorded_cpu_kind()  # the token ids: where they were recorded
    exact = [row for row in rebuilt["records"] if gen.record_is_exact(row)]
    assert exact == [row for row in stored if gen.record_is_exact(row)]


def test_todays_drafters_describe_themselves_the_same(gen, fixtures):
    described = gen.build_describe(fixtures / "packages")
    stored = gen.read_json(fixtures / "http" / "describe.json")
    assert gen.name_paths(described) == gen.name_paths(stored)  # names what changed
    assert described == stored
