"""Secrets are masked in every log record a handler emits, tracebacks included."""

import io
import logging

from serving.security import logs

KEY = "sk-test-0123456789abcdef"


def test_keys_and_url_passwords_are_masked_in_messages_and_tracebacks():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("specops-test-secrets")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logs.install([KEY])
        assert any(isinstance(f, logs.SecretFilter) for f in handler.filters)
        logger.warning("key %s used against %s", KEY, "postgresql://me:hunter2@db:5432/x")
        try:
            raise RuntimeError(f"bad key {KEY}")
        except RuntimeError:
            logger.exception("failed")
        logs.install(["second-secret-value"])  # idempotent: one filter, more secrets
        assert sum(isinstance(f, logs.SecretFilter) for f in handler.filters) == 1
        logger.warning("and second-secret-value")
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert KEY not in text and "hunter2" not in text and "second-secret-value" not in text
    assert "postgresql://me:***@db:5432/x" in text and "bad key ***" in text


def test_mask_text_leaves_plain_urls_alone():
    assert logs.mask_text("http://host:5000/path") == "http://host:5000/path"
    assert logs.mask_text("http://u:p@host/") == "http://u:***@host/"
