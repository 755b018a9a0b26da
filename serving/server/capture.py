"""Traffic capture: a share of requests runs in detailed mode and lands in the store.

Captured requests become current-schema records (workload ``live``, split ``train``) in the
same append-only store that ``specops data collect`` writes and the collect flow
validates: ``<store>/records/hardware=<target>/date=<day>/part-serve-....jsonl``. Records
are buffered and flushed as atomic parts (every ``chunk_size`` records, every
``max_age_s`` seconds, and at shutdown), so a reader never sees half a part.

Several replicas, on one host or many sharing a network folder, capture into one store.
Each capture's run id (:func:`capture_run_id`) names the replica (when configured), the
host, the start time, the process id and a random token, so no two processes pick the same
part names; and a part is never written over an existing one (:func:`store.write_part`):
if a name were ever taken, the flush fails, keeps its rows and retries them under the next
part number, so no records are lost either way.

The record schema and the store writer are :mod:`serving.records`, shared with the data
stage's collection, so that captured traffic cannot drift from collected traffic.

Before a record is buffered it is redacted (:mod:`serving.security.redact`, when a
redactor is configured): secrets in its text become placeholders and the tokens carrying
them a mask token, positions kept; the result is re-checked against the record schema, and
a record that cannot be redacted or no longer validates is dropped with its reason (logged
and counted through ``on_dropped``), never written. A client's opt-out is decided before
this, by the server: an opted-out request is never decoded in detailed mode at all.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from serving.engine.detailed import DetailedRecord
from serving.errors import BadInputError
from serving.hardware import HardwareTarget
from serving.records import store
from serving.records.schema import LIVE_WORKLOAD, from_detailed, parse_record, record_id
from serving.security.redact import RecordDropped, Redactor, mask_token, redact_record
from serving.server.config import REPLICA_PATTERN

log = logging.getLogger(__name__)

_HOST_CHARS = 24  # a host name is cut to this; the pid and token keep run ids apart


def check_replica(replica: str) -> str:
    """``replica`` unchanged, or :class:`BadInputError` naming it when it cannot be part of
    a file name."""
    if not isinstance(replica, str) or not re.fullmatch(REPLICA_PATTERN, replica):
        raise BadInputError(
            f"replica name {replica!r} cannot name capture parts: use 1-40 letters, digits, "
            "'-' or '_', starting with a letter or digit (e.g. 'eu-1')"
        )
    return replica


def host_label(hostname: str | None = None) -> str:
    """The host name (default this machine's) as a file-name-safe label: lower case, runs of
    anything but letters and digits as one ``-``, at most 24 characters; ``host`` if
    nothing is left."""
    name = (socket.gethostname() if hostname is None else hostname).lower()
    label = re.sub(r"[^a-z0-9]+", "-", name).strip("-")[:_HOST_CHARS].strip("-")
    return label or "host"


def capture_run_id(
    replica: str | None = None,
    *,
    hostname: str | None = None,
    pid: int | None = None,
    started: float | None = None,
) -> str:
    """``serve-[<replica>-]<host>-<UTC start>-<pid>-<token>``: unique per capturing process
    across hosts that share a store. The host and pid alone are not enough (containers
    reuse both: every pod may be ``pid 1`` on a host named ``localhost``), hence the
    random 6-hex-digit token; the replica name, when set, says which deployment wrote a
    part."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started))
    parts = ["serve"]
    if replica is not None:
        parts.append(check_replica(replica))
    parts += [host_label(hostname), stamp, str(os.getpid() if pid is None else pid)]
    return "-".join([*parts, secrets.token_hex(3)])


class Capture:
    def __init__(
        self,
        *,
        root: Path,
        share: float,
        hardware: HardwareTarget,
        drafter_version: str = "builtin",
        failure_threshold: float = 0.5,
        seed: int = 0,
        chunk_size: int = 8,
        max_age_s: float = 30.0,
        replica: str | None = None,
        redactor: Redactor | None = None,
        tokenizer=None,
        on_redacted: Callable[[Counter[str]], None] | None = None,
        on_dropped: Callable[[str, str], None] | None = None,
    ) -> None:
        if redactor is not None and tokenizer is None:
            raise ValueError("redaction needs the tokenizer (to find the tokens of a secret)")
        self.root = Path(root)
        self.redactor, self.tokenizer = redactor, tokenizer
        self.mask_id = mask_token(tokenizer) if tokenizer is not None else None
        self.on_redacted = on_redacted or (lambda counts: None)
        self.on_dropped = on_dropped or (lambda kind, reason: None)
        self.dropped: Counter[str] = Counter()
        self.share = share
        self.hardware = hardware
        self.drafter_version = drafter_version
        self.failure_threshold = failure_threshold
        self.chunk_size = chunk_size
        self.max_age_s = max_age_s
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._buffer: list[dict] = []
        self._oldest: float | None = None
        self.run_id = capture_run_id(replica)
        self._part = 0
        self.parts: list[str] = []

    def wants(self) -> bool:
        """Decide (seeded) whether the next request runs in detailed mode."""
        if self.share <= 0.0:
            return False
        with self._lock:
            return self._rng.random() < self.share

    def add(
        self,
        record: DetailedRecord,
        *,
        prompt_text: str,
        output_text: str,
        drafter_version: str | None = None,
    ) -> bool:
        """Redact the record and buffer it (a full buffer is flushed); False when it was
        dropped instead. Costs a tokenizer pass per secret-bearing record: call it off the
        event loop."""
        prompt_id = "live-" + hashlib.sha256(prompt_text.encode()).hexdigest()[:16]
        row = from_detailed(
            record,
            record_key=record_id(self.run_id, record.request_id),
            prompt_id=prompt_id,
            workload=LIVE_WORKLOAD,
            split="train",
            prompt=prompt_text,
            output_text=output_text,
            drafter_version=drafter_version or self.drafter_version,
            hardware=self.hardware.name,
            run_id=self.run_id,
            failure_threshold=self.failure_threshold,
        )
        if self.redactor is not None:
            try:
                row, counts = redact_record(row, self.redactor, self.tokenizer, self.mask_id)
                parse_record(row)  # what validation will check first
            except RecordDropped as error:
                return self._drop(error.kind, error.reason)
            except ValidationError as error:
                first = error.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                return self._drop("invalid", f"the redacted record does not validate: {where}")
            if counts:
                self.on_redacted(counts)
        with self._lock:
            self._buffer.append(row)
            self._oldest = self._oldest or time.monotonic()
            due = len(self._buffer) >= self.chunk_size
        if due:
            self.flush()
        return True

    def _drop(self, kind: str, reason: str) -> bool:
        log.warning("capture: a record was dropped, not written: %s", reason)
        with self._lock:
            self.dropped[kind] += 1
        self.on_dropped(kind, reason)
        return False

    def flush_if_old(self) -> None:
        with self._lock:
            due = self._oldest is not None and time.monotonic() - self._oldest >= self.max_age_s
        if due:
            self.flush()

    def flush(self) -> int:
        """Write the buffered records as atomic parts; return how many were written."""
        with self._lock:
            rows, self._buffer, self._oldest = self._buffer, [], None
            if not rows:
                return 0
            planned = store.plan_parts(self.root, self.hardware.name, self.run_id, self._part, rows)
            # Past every planned number, written or not: a retried part gets a new one.
            self._part += len(planned)
            written = 0
            for path, part_rows in planned:
                try:
                    store.write_part(path, part_rows)
                except OSError:
                    # Keep the rows for the next flush rather than lose them (also when the
                    # name is taken: FileExistsError; the retry gets a new part number).
                    log.exception("capture: could not write %s; will retry", path)
                    self._buffer[:0] = part_rows
                    self._oldest = time.monotonic()
                    continue
                self.parts.append(str(path))
                written += len(part_rows)
            return written
