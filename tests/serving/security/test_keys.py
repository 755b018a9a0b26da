"""API keys: where they come from, how they are checked, and when binding is refused."""

import os

import pytest

from serving.errors import BadInputError
from serving.security.keys import (
    ApiKeyError,
    check_bind,
    from_keys,
    is_loopback,
    load_api_keys,
)

KEY = "sk-test-0123456789abcdef"
OTHER = "another-key-0123456789"


def key_file(tmp_path, text, mode=0o600):
    path = tmp_path / "keys"
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_keys_from_the_environment_and_a_file(tmp_path):
    path = key_file(tmp_path, f"# team keys\n{OTHER}\n\n")
    keys = load_api_keys(env="K", path=path, environ={"K": f"{KEY}, {KEY}"})
    assert keys.enabled and len(keys.digests) == 2
    assert keys.check(KEY) and keys.check(OTHER)
    assert not keys.check(KEY[:-1]) and not keys.check("") and not keys.check(KEY + "x")
    assert KEY not in repr(keys) and OTHER not in repr(keys)


def test_no_keys_means_open():
    keys = load_api_keys(env="K", environ={})
    assert not keys.enabled and not keys.check(KEY)


@pytest.mark.parametrize(
    ("text", "mode", "needle"),
    [
        (f"{KEY}\n", 0o644, "readable by others"),
        ("# nothing\n", 0o600, "holds no key"),
        ("short\n", 0o600, "at least 16"),
        ("two words here and there\n", 0o600, "spaces"),
    ],
)
def test_bad_key_files_are_refused_without_showing_a_key(tmp_path, text, mode, needle):
    path = key_file(tmp_path, text, mode)
    with pytest.raises(ApiKeyError, match=needle) as error:
        load_api_keys(env="K", path=path, environ={})
    assert KEY not in str(error.value) and "short" not in str(error.value).split("at")[0]


def test_a_missing_key_file_is_named(tmp_path):
    with pytest.raises(ApiKeyError, match="cannot read the API key file"):
        load_api_keys(env="K", path=tmp_path / "absent", environ={})


def test_a_short_key_in_the_environment_is_named_by_variable():
    with pytest.raises(ApiKeyError, match=r"\$K \(key 2\)"):
        load_api_keys(env="K", environ={"K": f"{KEY},tiny"})


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("::1", True), ("localhost", True), ("0.0.0.0", False),
     ("10.1.2.3", False), ("example.org", False)],
)  # fmt: skip
def test_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_binding_beyond_loopback_needs_a_key_or_an_explicit_opening():
    check_bind("127.0.0.1", from_keys([]), allow_open=False)
    check_bind("0.0.0.0", from_keys([KEY]), allow_open=False)
    check_bind("0.0.0.0", from_keys([]), allow_open=True)
    with pytest.raises(BadInputError, match=r"refusing to bind '0\.0\.0\.0'"):
        check_bind("0.0.0.0", from_keys([]), allow_open=False)
    with pytest.raises(BadInputError, match=r"Set \$SPECOPS_API_KEYS or --api-key-file"):
        check_bind("0.0.0.0", from_keys([]), allow_open=False, key_file="--api-key-file")


def test_specops_clients_send_the_first_key_of_the_environment():
    from serving.security.keys import client_key

    assert client_key("K", {"K": f"{KEY},{OTHER}"}) == KEY
    assert client_key("K", {}) == "specops"


def test_a_client_key_file_wins_over_the_environment_and_is_checked(tmp_path):
    from serving.security.keys import client_key

    path = key_file(tmp_path, f"# mine\n{OTHER}\n{KEY}\n")
    assert client_key("K", {"K": KEY}, path=path) == OTHER  # the file's first key
    os.chmod(path, 0o644)
    with pytest.raises(ApiKeyError, match="readable by others"):
        client_key("K", {}, path=path)
