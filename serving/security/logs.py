"""Secrets kept out of logs: a logging filter that masks the configured secrets (the
servers' API keys) and any password in a URL (``scheme://user:secret@host``) in every
record a handler emits, its formatted traceback included.

:func:`install` attaches it to the handlers of the root logger and of every logger that
has its own (uvicorn's, Prefect's), so records are masked whichever logger made them.
Messages that specops writes itself never name a key (:mod:`serving.security.keys`) and
show URIs through :func:`registry.config.mask_uri`; this is the net under them, for
third-party messages and tracebacks.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)[^\s@/]+@")
MASK = "***"


def mask_text(text: str, secrets: Iterable[str] = ()) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    return _URL_PASSWORD.sub(rf"\g<1>{MASK}@", text)


class SecretFilter(logging.Filter):
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__("specops-secrets")
        self.secrets: set[str] = {s for s in secrets if s}
        self._formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_text(message, self.secrets)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask_text(record.exc_text, self.secrets)
        return True


def _handlers() -> list[logging.Handler]:
    loggers = [logging.getLogger()] + [
        logger
        for logger in logging.root.manager.loggerDict.values()
        if isinstance(logger, logging.Logger)
    ]
    return [handler for logger in loggers for handler in logger.handlers]


def install(secrets: Iterable[str] = ()) -> SecretFilter:
    """Mask ``secrets`` (and URL passwords) in every handler there is now; idempotent
    (a second call adds its secrets to the filter already installed)."""
    installed: SecretFilter | None = None
    for handler in _handlers():
        for existing in handler.filters:
            if isinstance(existing, SecretFilter):
                installed = existing
    if installed is None:
        installed = SecretFilter()
    installed.secrets |= {s for s in secrets if s}
    for handler in _handlers():
        if installed not in handler.filters:
            handler.addFilter(installed)
    return installed
