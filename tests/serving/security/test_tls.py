"""TLS files: a server's certificate and key, a client's CA file, each checked when loaded
with an error naming the file (never later, inside uvicorn or grpcio)."""

from __future__ import annotations

import os
import shutil

import pytest

from serving.security.tls import TlsError, ca_context, read_ca, server_tls, uvicorn_tls


def test_a_good_pair_loads_and_says_how_to_serve_it(tls_files):
    tls = server_tls(tls_files.cert, tls_files.key)
    assert tls is not None
    assert uvicorn_tls(tls) == {
        "ssl_certfile": str(tls_files.cert),
        "ssl_keyfile": str(tls_files.key),
    }
    assert tls.grpc_credentials() is not None
    assert server_tls(None, None) is None and uvicorn_tls(None) == {}


@pytest.mark.parametrize("given", ["cert", "key"])
def test_one_without_the_other_is_refused(tls_files, given):
    cert, key = (tls_files.cert, None) if given == "cert" else (None, tls_files.key)
    with pytest.raises(TlsError, match="give both \\(--tls-cert and --tls-key"):
        server_tls(cert, key)


def test_a_key_others_can_read_is_refused(tls_files, tmp_path):
    key = tmp_path / "open.key"
    shutil.copy(tls_files.key, key)
    os.chmod(key, 0o644)
    with pytest.raises(TlsError, match=f"TLS key '{key}' is readable by others.*chmod 600"):
        server_tls(tls_files.cert, key)


def test_a_key_that_is_not_the_certificates_is_refused(tls_files, tmp_path):
    not_pem = tmp_path / "notes.txt"
    not_pem.write_text("not a certificate\n")
    with pytest.raises(TlsError, match=f"certificate '{tls_files.ca}' and key .* do not load"):
        server_tls(tls_files.ca, tls_files.key)  # the CA's certificate, the server's key
    with pytest.raises(TlsError, match=f"certificate '{not_pem}'"):
        server_tls(not_pem, tls_files.key)
    with pytest.raises(TlsError, match=r"cannot read the TLS certificate '/nowhere\.pem'"):
        server_tls("/nowhere.pem", tls_files.key)


def test_an_encrypted_key_is_refused_without_a_prompt(tls_files, tmp_path):
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(tls_files.key.read_bytes(), password=None)
    locked = tmp_path / "locked.key"
    locked.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret-passphrase"),
        )
    )
    os.chmod(locked, 0o600)
    with pytest.raises(TlsError, match=f"TLS key '{locked}' is encrypted"):
        server_tls(tls_files.cert, locked)


def test_a_ca_file_must_hold_a_certificate(tls_files, tmp_path):
    assert read_ca(tls_files.ca).startswith(b"-----BEGIN CERTIFICATE-----")
    assert ca_context(tls_files.ca).get_ca_certs()[0]["subject"]
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    for bad in (empty, tls_files.key):
        with pytest.raises(TlsError, match=f"CA file '{bad}' holds no PEM certificate"):
            ca_context(bad)
    with pytest.raises(TlsError, match=r"cannot read the CA file '/nowhere\.pem'"):
        read_ca("/nowhere.pem")
