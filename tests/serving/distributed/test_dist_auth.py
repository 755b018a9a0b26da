"""Keys and TLS on the gRPC target server, for real on loopback: a TLS port with API keys
(a certificate generated for the test), the draft client over it with the CA file.
A call without a key, with a wrong one or a malformed header is UNAUTHENTICATED and never
reaches the model; a client that does not trust the server's CA, or speaks plain gRPC to
it, gets nothing; a host beyond loopback is refused without keys."""

from __future__ import annotations

import grpc
import pytest

from serving.distributed.client import RemoteError, TargetClient, run_fused
from serving.distributed.proto import specops_distributed_pb2 as pb
from serving.distributed.proto import specops_distributed_pb2_grpc as pb_grpc
from serving.distributed.server import TargetLimits, TargetService, serve_target
from serving.engine.decoder import SpeculativeDecoder
from serving.errors import BadInputError
from serving.security.keys import from_keys
from serving.security.tls import grpc_channel_credentials, server_tls

KEY = "sk-target-0123456789abcdef"
WRONG = "sk-wrong-0123456789abcdef"
NEW = 12


@pytest.fixture(scope="module")
def forwards(loaded):
    """How many times the target model ran (a forward pre-hook counts them)."""
    calls = []
    handle = loaded.model.register_forward_pre_hook(lambda *_: calls.append(1))
    yield calls
    handle.remove()


@pytest.fixture(scope="module")
def secure(loaded, tls_files, forwards):
    service = TargetService(loaded, eos_token_ids=[], limits=TargetLimits(max_sessions=2))
    running = serve_target(
        service, keys=from_keys([KEY]), tls=server_tls(tls_files.cert, tls_files.key)
    )
    yield running
    running.stop()


def _address(running) -> str:
    return f"127.0.0.1:{running.port}"


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ((), "no API key"),
        ((("authorization", f"Bearer {WRONG}"),), "invalid API key"),
        ((("authorization", KEY),), "expected 'Bearer <key>'"),
    ],
)
def test_a_call_without_the_key_is_unauthenticated_and_never_reaches_the_model(
    secure, tls_files, forwards, prompt, metadata, says
):
    before = len(forwards)
    channel = grpc.secure_channel(_address(secure), grpc_channel_credentials(tls_files.ca))
    stub = pb_grpc.TargetServiceStub(channel)
    start = pb.StartRequest(prompt_token_ids=prompt, max_new_tokens=4)
    calls = [
        lambda: stub.Info(pb.InfoRequest(), metadata=metadata, timeout=10),
        lambda: stub.StartSession(start, metadata=metadata, timeout=10),
        lambda: list(stub.Generate(pb.GenerateRequest(session_id="x"), metadata=metadata)),
    ]
    try:
        for call in calls:
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert says in refused.value.details()
            assert KEY not in refused.value.details() and WRONG not in refused.value.details()
    finally:
        channel.close()
    assert len(forwards) == before  # no prefill, no pass
    assert len(secure.service.table) == 0  # no session was made


def test_the_key_over_tls_decodes_as_plain(secure, tls_files, forwards, loaded, prompt):
    expected = SpeculativeDecoder(loaded).generate(prompt, max_new_tokens=NEW).token_ids
    before = len(forwards)
    with TargetClient(_address(secure), api_key=KEY, tls_ca=tls_files.ca) as client:
        assert client.info().model == "target"
        result = run_fused(client, prompt, server_drafter="pld", k=3, max_new_tokens=NEW)
    assert result.token_ids == expected
    assert len(forwards) > before


def test_the_client_reads_its_key_from_the_environment(secure, tls_files, monkeypatch):
    monkeypatch.setenv("SPECOPS_API_KEYS", f"{KEY},{WRONG}")  # the first is sent
    with TargetClient(_address(secure), tls_ca=tls_files.ca) as client:
        assert client.info().max_block > 0
    monkeypatch.setenv("SPECOPS_API_KEYS", WRONG)
    refused = pytest.raises(RemoteError, match="Info failed: UNAUTHENTICATED: invalid API key")
    with TargetClient(_address(secure), tls_ca=tls_files.ca) as client, refused:
        client.info()


@pytest.mark.parametrize("trust", ["other_ca", "system", "plain"])
def test_a_client_that_does_not_trust_the_server_gets_nothing(secure, tls_files, trust):
    options = {
        "other_ca": {"tls_ca": tls_files.other_ca},
        "system": {"tls": True},
        "plain": {},
    }[trust]
    client = TargetClient(_address(secure), api_key=KEY, timeout_s=5, **options)
    with client, pytest.raises(RemoteError) as failed:
        client.info()
    assert failed.value.code == grpc.StatusCode.UNAVAILABLE


def test_beyond_loopback_without_a_key_is_refused(loaded):
    service = TargetService(loaded, eos_token_ids=[])
    with pytest.raises(BadInputError, match=r"refusing to bind '0\.0\.0\.0'.*--api-key-file"):
        serve_target(service, host="0.0.0.0")
    assert not service.scheduler._thread.is_alive()  # closed with the refusal
