"""A real `specops serve` process with API keys and TLS (its own, with a certificate made
for the test), driven by the official openai client:
no key, a wrong key and a malformed header get 401 and never reach the queue; bodies over
the limits get 413/400; a client's capture opt-out is honoured (nothing written); planted
secrets are redacted and the captured record still validates; no key appears in the log.
The tiny random target with the real tokenizer keeps this fast."""

import os
import subprocess
import sys

import httpx
import openai
import pytest

from serving.records import store
from tasks.data.validate import validate_store
from tasks.ops.server_process import ServerProcess

pytestmark = pytest.mark.slow  # `specops serve` processes (each imports torch and a model)

FILE_KEY = "sk-file-key-0123456789abcdef"
ENV_KEY = "sk-env-key-0123456789abcdefgh"
WRONG_KEY = "sk-wrong-key-0123456789abcdef"
EMAIL = "alice.smith@example.com"
PLANTED_KEY = "sk-proj-AbCdEfGhIjKlMnOpQrStUv123456"
OPTED_OUT = "this prompt opted out of capture"
# The seven: one secret a request, the kinds a user pastes (each repeated, so that the
# lookup drafter proposes it again as a draft the target may reject).
SEVEN = {
    "email": EMAIL,
    "api_key": PLANTED_KEY,
    "aws": "AKIAABCDEFGHIJKLMNOP",
    "github": "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abcDEF123",
    "card_number": "4111 1111 1111 1111",
    "secret_assignment": "password=hunter22x",
}
OPTED_OUT_HEADER = "this prompt opted out by header"
CONFIG = """
model_name: smollm2
champion: {source: static, drafter: pld}
limits: {max_tokens: 64, max_body_bytes: 65536, max_messages: 4, max_prompt_chars: 2000}
capture: {share: 1.0, store: STORE, redact_patterns: ['PROJECT-[0-9]{4}']}
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory, model_folder, tls_files):
    root = tmp_path_factory.mktemp("secure")
    keys = root / "keys"
    keys.write_text(f"# the team's key\n{FILE_KEY}\n")
    os.chmod(keys, 0o600)
    config = root / "serving.yaml"
    config.write_text(CONFIG.replace("STORE", str(root / "store")))
    args = [
        "--config", str(config), "--target", str(model_folder), "--threads", "1",
        "--api-key-file", str(keys),
        "--tls-cert", str(tls_files.cert), "--tls-key", str(tls_files.key),
    ]  # fmt: skip
    return root, args


@pytest.fixture(scope="module")
def server(setup, tls_files):
    root, args = setup
    process = ServerProcess(
        args, log_path=root / "server.log", env={"SPECOPS_API_KEYS": ENV_KEY}, tls_ca=tls_files.ca
    )
    with process:
        yield process


def client(server, key):
    """The openai client, trusting the test's CA (the servers here serve TLS themselves)."""
    http = openai.DefaultHttpxClient(verify=server.verify)
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, http_client=http)


def request(server, method, path, **kwargs):
    return httpx.request(method, f"{server.url}{path}", verify=server.verify, **kwargs)


def chat(server, key, content="hello there", **extra):
    return client(server, key).chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": content}],
        max_tokens=8,
        temperature=0,
        **extra,
    )


def test_either_key_is_accepted(server):
    for key in (FILE_KEY, ENV_KEY):
        answer = chat(server, key)
        assert answer.choices[0].finish_reason in ("length", "stop")
        assert client(server, key).models.list().data[0].id == "smollm2"


def test_the_server_serves_tls_itself(server, setup, tls_files):
    """`specops serve --tls-cert --tls-key`: uvicorn's own TLS. A client with the CA file
    gets answers (every test here goes over it); one trusting only the system's CAs, or
    speaking plain HTTP to the port, gets nothing."""
    assert server.url.startswith("https://")
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{server.url}/health")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{server.port}/health")
    root, _ = setup
    assert f"on https://127.0.0.1:{server.port}/v1" in (root / "server.log").read_text()


@pytest.mark.parametrize("key", [WRONG_KEY, "x"])
def test_a_wrong_key_is_401(server, key):
    with pytest.raises(openai.AuthenticationError) as error:
        chat(server, key)
    assert error.value.status_code == 401
    body = error.value.body
    assert isinstance(body, dict) and body["code"] == "invalid_api_key"


def test_a_malformed_authorization_header_is_401_not_500(server):
    for header in ("Bearer", "Basic abc", "Bearer a b", "Token " + FILE_KEY):
        response = request(
            server,
            "POST",
            "/v1/completions",
            json={"model": "smollm2", "prompt": "hi"},
            headers={"Authorization": header},
        )
        assert response.status_code == 401, header
        assert "malformed Authorization header" in response.json()["error"]["message"]


def test_health_is_open_and_metrics_needs_a_key(server):
    assert request(server, "GET", "/health").status_code == 200
    assert request(server, "GET", "/metrics").status_code == 401
    metrics = request(server, "GET", "/metrics", headers={"Authorization": f"Bearer {ENV_KEY}"})
    assert metrics.status_code == 200
    assert (
        'specops:requests_rejected_total{hardware="cpu",model_name="smollm2",reason="invalid"}'
        in (metrics.text)
    )


def test_a_flood_of_unauthenticated_requests_never_reaches_the_queue(server):
    for _ in range(50):  # no key at all
        response = request(server, "POST", "/v1/completions", content=b"{}")
        assert response.status_code == 401 and "no API key" in response.text
    health = request(server, "GET", "/health").json()
    assert health["requests_waiting"] == 0 and health["requests_running"] == 0
    assert chat(server, FILE_KEY).choices  # and the server still serves


def test_an_oversized_body_is_413_before_it_is_read(server):
    with pytest.raises(openai.APIStatusError) as error:
        chat(server, FILE_KEY, content="x" * 70_000)
    assert error.value.status_code == 413
    assert "at most 65536 bytes" in str(error.value)


def test_too_many_messages_or_characters_are_400_naming_the_limit(server):
    api = client(server, FILE_KEY)
    with pytest.raises(openai.BadRequestError, match=r"at most 4 \(limits.max_messages\)"):
        api.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "hi"}] * 5, max_tokens=4
        )
    with pytest.raises(openai.BadRequestError, match=r"2001 characters.*max_prompt_chars"):
        api.completions.create(model="smollm2", prompt="y" * 2001, max_tokens=4)


def test_opt_out_is_honoured_and_secrets_are_redacted(setup, model_folder, tmp_path, tls_files):
    """A server of its own, stopped before the store is read (a stop flushes the capture)."""
    root, args = setup
    store_root = root / "store"
    log = tmp_path / "server.log"
    secret_prompt = f"Mail {EMAIL}, key {PLANTED_KEY}, ticket PROJECT-1234. Mail {EMAIL}."
    process = ServerProcess(
        args, log_path=log, env={"SPECOPS_API_KEYS": ENV_KEY}, tls_ca=tls_files.ca
    )
    with process as server:
        chat(server, FILE_KEY, content=OPTED_OUT, extra_body={"capture": False})
        chat(server, FILE_KEY, content=OPTED_OUT + " (store)", extra_body={"store": False})
        client(server, FILE_KEY).with_options(
            default_headers={"X-SpecOps-Capture": "off"}
        ).chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": OPTED_OUT_HEADER}],
            max_tokens=8,
        )
        with pytest.raises(openai.BadRequestError, match="X-SpecOps-Capture"):
            client(server, FILE_KEY).with_options(
                default_headers={"X-SpecOps-Capture": "maybe"}
            ).chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        chat(server, FILE_KEY, content=secret_prompt)
        for secret in SEVEN.values():
            chat(server, FILE_KEY, content=f"Keep {secret} safe; again: {secret} {secret}")
        chat(server, FILE_KEY, content="plain words, nothing secret")
        metrics = request(
            server, "GET", "/metrics", headers={"Authorization": f"Bearer {FILE_KEY}"}
        ).text
    assert 'specops:capture_opt_outs_total{hardware="cpu",model_name="smollm2"} 3.0' in metrics
    redactions = 'specops:capture_redactions_total{hardware="cpu",kind="%s",model_name="smollm2"}'
    assert redactions % "email" + " 5.0" in metrics and redactions % "pattern_1" + " 1.0" in metrics
    parts = store.part_files(store_root)
    raw = "".join(p.read_text() for p in parts)
    assert OPTED_OUT not in raw and OPTED_OUT_HEADER not in raw, "an opted-out prompt was kept"
    for secret in (EMAIL, PLANTED_KEY, "PROJECT-1234", *SEVEN.values()):
        assert secret not in raw
    result = validate_store(store_root, known_hardware={"cpu"}, run_id="security-test")
    assert result.summary.quarantined == 0, result.quarantined
    prompts = [r.prompt for r in result.valid]
    assert "plain words, nothing secret" in prompts
    (redacted,) = [p for p in prompts if "[REDACTED:pattern_1]" in p]
    kept = [p for p in prompts if p.startswith("Keep [REDACTED:")]
    assert len(kept) == len(SEVEN), "a redacted record was dropped or quarantined"
    assert redacted.count("[REDACTED:email]") == 2 and "[REDACTED:pattern_1]" in redacted
    log_text = log.read_text() + (root / "server.log").read_text()
    for secret in (FILE_KEY, ENV_KEY, WRONG_KEY, EMAIL, PLANTED_KEY):
        assert secret not in log_text, "a secret reached the server's log"


def serve_fails(args, env=None):
    result = subprocess.run(
        [sys.executable, "-m", "specops.cli", "serve", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "SPECOPS_API_KEYS": "", **(env or {})},
        timeout=120,
    )
    assert result.returncode != 0
    return result.stderr


def test_binding_beyond_loopback_without_a_key_is_refused():
    error = serve_fails(["--host", "0.0.0.0"])
    assert "refusing to bind '0.0.0.0'" in error and "--allow-unauthenticated" in error


def test_a_redaction_pattern_that_does_not_compile_stops_the_server(tmp_path):
    config = tmp_path / "serving.yaml"
    config.write_text("capture: {redact_patterns: ['ok-[0-9]+', '(unclosed']}\n")
    error = serve_fails(["--config", str(config)])
    assert "'(unclosed' (pattern_2) does not compile" in error
