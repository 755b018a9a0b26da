"""API keys: read from an environment variable or a key file, never from a command line's
visible arguments, and checked in constant time.

- ``SPECOPS_API_KEYS`` (or the variable the config names): keys separated by commas or
  whitespace;
- a key file: one key per line; blank lines and lines starting with ``#`` are skipped.

Only SHA-256 digests of the keys are kept; a presented key is hashed and compared with
every digest by :func:`hmac.compare_digest`, all of them, so neither the comparison nor the
number of keys tried says how close a guess came. Errors name where a bad key came from
(the variable, or the file and line), never the key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from serving.errors import BadInputError

DEFAULT_KEY_ENV = "SPECOPS_API_KEYS"
MIN_KEY_CHARS = 16
_KEY = re.compile(r"[\x21-\x7e]+")  # printable ASCII without spaces: what a header carries


class ApiKeyError(BadInputError):
    """A key source that cannot be used (named; the key itself never is)."""


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class ApiKeys:
    """The accepted keys, as digests, and where they came from (for messages)."""

    digests: tuple[bytes, ...]
    sources: tuple[str, ...]
    secrets: tuple[str, ...] = ()  # the keys themselves, kept only to mask them in logs

    @property
    def enabled(self) -> bool:
        return bool(self.digests)

    def check(self, presented: str) -> bool:
        """Whether ``presented`` is one of the keys, compared in constant time."""
        digest = _digest(presented)
        found = False
        for known in self.digests:  # no early exit: every digest is compared
            found |= hmac.compare_digest(digest, known)
        return found

    def __repr__(self) -> str:  # never print the keys
        return f"ApiKeys({len(self.digests)} keys from {', '.join(self.sources) or 'nowhere'})"


def _checked(key: str, where: str) -> str:
    if not _KEY.fullmatch(key):
        raise ApiKeyError(f"the API key at {where} has spaces or non-printable characters")
    if len(key) < MIN_KEY_CHARS:
        raise ApiKeyError(
            f"the API key at {where} has {len(key)} characters; use at least {MIN_KEY_CHARS} "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return key


def keys_from_env(name: str = DEFAULT_KEY_ENV, environ: dict[str, str] | None = None) -> list[str]:
    value = (os.environ if environ is None else environ).get(name, "")
    keys = [k for k in re.split(r"[\s,]+", value) if k]
    return [_checked(k, f"${name} (key {i + 1})") for i, k in enumerate(keys)]


def client_key(
    env: str = DEFAULT_KEY_ENV, environ: dict[str, str] | None = None, *, path: Path | None = None
) -> str:
    """The key specops's own clients (load test, deployment cycle, distributed client) send
    to its servers: the first key of the key file ``path`` when given, else the first of
    ``$SPECOPS_API_KEYS`` (a server started in the same environment reads it too), else a
    placeholder (the openai client wants some key; an open server ignores it)."""
    keys = keys_from_file(path) if path is not None else keys_from_env(env, environ)
    return keys[0] if keys else "specops"


def read_private(path: Path, what: str = "API key file") -> bytes:
    """The bytes of a secret's file (an API key file, a TLS private key), refused when the
    file's group or others have any access to it: ``what`` names it in the message."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as error:
        raise ApiKeyError(f"cannot read the {what} {str(path)!r}: {error.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ApiKeyError(
            f"the {what} {str(path)!r} is readable by others (mode "
            f"{stat.filemode(mode)}); run: chmod 600 {path}"
        )
    return data


def keys_from_file(path: Path) -> list[str]:
    path = Path(path)
    try:
        text = read_private(path).decode()
    except UnicodeDecodeError:
        raise ApiKeyError(f"the API key file {str(path)!r} is not text") from None
    keys = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if line and not line.startswith("#"):
            keys.append(_checked(line, f"{path}:{number}"))
    if not keys:
        raise ApiKeyError(f"the API key file {str(path)!r} holds no key")
    return keys


def load_api_keys(
    *, env: str = DEFAULT_KEY_ENV, path: Path | None = None, environ: dict[str, str] | None = None
) -> ApiKeys:
    """The keys from the variable ``env`` and the file ``path`` (both, when both are set)."""
    found: list[tuple[str, str]] = [(k, f"${env}") for k in keys_from_env(env, environ)]
    if path is not None:
        found += [(k, str(path)) for k in keys_from_file(path)]
    return from_keys([k for k, _ in found], sources=dict.fromkeys(s for _, s in found))


def from_keys(keys: Iterable[str], sources: Iterable[str] = ("given",)) -> ApiKeys:
    unique = list(dict.fromkeys(keys))
    return ApiKeys(
        digests=tuple(_digest(k) for k in unique),
        sources=tuple(sources) if unique else (),
        secrets=tuple(unique),
    )


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server on this machine."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_bind(
    host: str, keys: ApiKeys, *, allow_open: bool, key_file: str = "security.api_key_file"
) -> None:
    """Refuse to serve beyond loopback without keys unless explicitly allowed; ``key_file``
    names the setting that gives a key file (a config key, or a command's option)."""
    if keys.enabled or allow_open or is_loopback(host):
        return
    raise BadInputError(
        f"refusing to bind {host!r} (beyond loopback) with no API key: anyone who can reach "
        f"it could use the model. Set ${DEFAULT_KEY_ENV} or {key_file} (docs/security.md), "
        "or pass --allow-unauthenticated to serve openly on purpose"
    )
