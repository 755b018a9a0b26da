"""TLS served by specops's servers themselves, and trusted by its clients of them.

- A server (``specops serve``, the vLLM front, ``specops distributed serve-target``) gets
  a certificate chain and its private key (:class:`ServerTls`, :func:`server_tls`): uvicorn
  serves HTTPS with them (``ssl_certfile``/``ssl_keyfile``), grpcio a secure port
  (``grpc.ssl_server_credentials``).
- A client (the load test, the deployment cycle, the distributed client) gets a CA file, the
  certificates it trusts (:func:`ca_context` for httpx and the openai client,
  :func:`grpc_channel_credentials` for gRPC); without one it trusts the system's.

Both are checked when loaded, before anything slow, by Python's own ``ssl``: a file that is
missing, not PEM, a key that does not match the certificate or that is encrypted, a key
others can read (as an API key file, :func:`serving.security.keys.read_private`), each fail
naming the file and the fix.
"""

from __future__ import annotations

import contextlib
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypedDict

from serving.errors import BadInputError
from serving.security.keys import ApiKeyError, read_private

if TYPE_CHECKING:
    import grpc


class TlsError(BadInputError):
    """A certificate, key or CA file that cannot be used (named)."""


def _read_key(path: Path) -> bytes:
    try:
        return read_private(path, "TLS key")
    except ApiKeyError as error:
        raise TlsError(str(error)) from None


def _encrypted(path: Path):
    def refuse() -> NoReturn:
        raise TlsError(
            f"the TLS key {str(path)!r} is encrypted: give an unencrypted key file of mode 600 "
            f"(e.g. openssl pkey -in {path} -out key.pem)"
        )

    return refuse


@dataclass(frozen=True)
class ServerTls:
    """A server's certificate chain (PEM, the leaf first) and its private key (PEM)."""

    cert: Path
    key: Path

    def grpc_credentials(self) -> grpc.ServerCredentials:
        import grpc

        pair = (_read_key(self.key), self.cert.read_bytes())
        return grpc.ssl_server_credentials([pair])


class UvicornTls(TypedDict, total=False):
    ssl_certfile: str
    ssl_keyfile: str


def uvicorn_tls(tls: ServerTls | None) -> UvicornTls:
    """uvicorn's options (``uvicorn.run(..., **uvicorn_tls(tls))``): none without TLS."""
    if tls is None:
        return {}
    return {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}


def server_tls(cert: Path | str | None, key: Path | str | None) -> ServerTls | None:
    """The server's TLS files, checked; None when neither is given (plain HTTP / gRPC)."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        given, missing = ("certificate", "key") if cert is not None else ("key", "certificate")
        raise TlsError(
            f"a TLS {given} without its {missing}: give both (--tls-cert and --tls-key, or "
            "security.tls_cert and security.tls_key)"
        )
    tls = ServerTls(Path(cert), Path(key))
    _read_key(tls.key)  # readable, and by nobody else
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.cert, tls.key, password=_encrypted(tls.key))
    except OSError as error:  # ssl.SSLError is an OSError too
        if not isinstance(error, ssl.SSLError):
            raise TlsError(
                f"cannot read the TLS certificate {str(tls.cert)!r}: {error.strerror}"
            ) from None
        raise TlsError(
            f"the TLS certificate {str(tls.cert)!r} and key {str(tls.key)!r} do not load "
            f"({error.reason or error}): both must be PEM, the key the certificate's own"
        ) from None
    return tls


def read_ca(path: Path | str) -> bytes:
    """The PEM certificates of a CA file, checked to hold at least one."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise TlsError(f"cannot read the CA file {str(path)!r}: {error.strerror}") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # no system certificates in it
    with contextlib.suppress(ssl.SSLError, UnicodeDecodeError, ValueError):
        context.load_verify_locations(cadata=data.decode("ascii"))
    certificates = context.cert_store_stats()["x509"]  # a pinned leaf counts too
    if not certificates:
        raise TlsError(
            f"the CA file {str(path)!r} holds no PEM certificate ('-----BEGIN CERTIFICATE-----')"
        )
    return data


def ca_context(path: Path | str | None) -> ssl.SSLContext:
    """What an httpx client verifies servers with (``verify=``): the certificates of the CA
    file ``path``, or the system's when None."""
    if path is None:
        return ssl.create_default_context()
    return ssl.create_default_context(cadata=read_ca(path).decode("ascii"))


def grpc_channel_credentials(path: Path | str | None) -> grpc.ChannelCredentials:
    """A gRPC client's TLS: the CA file's certificates, or the system's when None."""
    import grpc

    return grpc.ssl_channel_credentials(root_certificates=read_ca(path) if path else None)
