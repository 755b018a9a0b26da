"""The connection to the MLflow store behind the draft registry: where it is, whether it
answers, the experiments it logs to, and one error for any of its failures.

Where the store is comes from :mod:`registry.config` (flags, environment, file). A store
that does not answer fails construction with one :class:`RegistryError` naming its URI
(password masked) and where it was set (:func:`check_store`); one that fails later (the
server died mid-way) fails the operation the same way (:meth:`RegistryStore._store`).
What a failure leaves half-logged, a run no version points at yet, is deleted
(:meth:`RegistryStore._discard`).

:class:`RegistryStore` is the base of :class:`registry.client.Registry`: the versions,
promotion and evaluation parts (:mod:`registry.versions`, :mod:`registry.promotion`,
:mod:`registry.evaluations`) all log through it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from registry.config import RegistryConfig, load_registry_config, mask_uri, store_kind
from serving.errors import SpecOpsError

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0  # the reachability check of a tracking server or database


class RegistryError(SpecOpsError, RuntimeError):
    """The registry could not be reached, or refused an operation (the reason says why)."""


_ABSENT = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")


def _absent(error: Exception) -> bool:
    """An MLflow answer meaning "no such model, version or alias", as opposed to a store
    that failed (unreachable, broken): only the former may read as "none"."""
    return getattr(error, "error_code", None) in _ABSENT


def _brief(error: BaseException, secret: str | None = None) -> str:
    """The first line of ``error``'s message (of its DB-API cause for SQLAlchemy), without
    ``secret``."""
    cause = getattr(error, "orig", None) or error
    text = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    if len(text) > _BRIEF_CHARS:  # MLflow's REST errors quote the whole request
        reason = re.search(r"\[Errno -?\d+\][^\"')]*", text)
        text = f"{text[: _BRIEF_CHARS // 2]} ... {reason.group(0) if reason else text[-80:]}"
    return text.replace(secret, "***") if secret else text


_BRIEF_CHARS = 240


_DRIVER_HINT = {
    "postgresql": "install specops[postgres] (pip install 'specops[postgres]')",
    "mysql": "install mysqlclient, or pymysql with a mysql+pymysql:// URI",
    "mssql": "install pyodbc",
}


def check_store(uri: str, named: str) -> None:
    """Fail with one :class:`RegistryError` naming ``uri`` (its password masked) and
    ``named`` (which key, from which layer) unless the store answers: an http(s) server's
    ``/health``, a database's connection (its driver installed first); a SQLite store's
    folder is made."""
    shown = mask_uri(uri)
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        return
    if uri.startswith(("http://", "https://")):
        import httpx

        try:
            httpx.get(uri.rstrip("/") + "/health", timeout=CONNECT_TIMEOUT_S).raise_for_status()
        except httpx.HTTPError as error:
            raise RegistryError(
                f"the MLflow tracking server at {shown!r} ({named}) is unreachable "
                f"({_brief(error)}); start it, or point the registry elsewhere "
                "(docs/configuration.md: --tracking-uri, MLFLOW_TRACKING_URI, "
                "configs/registry.yaml)"
            ) from None
        return
    if store_kind(uri) == "database":
        _check_database(uri, named)


def _check_database(uri: str, named: str) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
    from sqlalchemy.pool import NullPool

    shown = mask_uri(uri)
    try:
        url = make_url(uri)
        dialect = url.get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as error:
        raise RegistryError(
            f"{shown!r} ({named}) is no database URL SQLAlchemy knows ({_brief(error)})"
        ) from None
    backend = url.get_backend_name()
    try:
        dialect.import_dbapi()
    except ImportError as error:
        hint = _DRIVER_HINT.get(backend, f"install the {backend} driver")
        raise RegistryError(
            f"the database driver for {shown!r} ({named}) is not installed "
            f"({_brief(error)}); {hint}"
        ) from None
    timeout = (
        {"connect_timeout": int(CONNECT_TIMEOUT_S)} if backend in ("postgresql", "mysql") else {}
    )
    engine = create_engine(url, connect_args=timeout, poolclass=NullPool)
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as error:
        raise RegistryError(
            f"the tracking database at {shown!r} ({named}) is unreachable "
            f"({_brief(error, url.password)}); start it, check the URI and its credentials, "
            "or point the registry elsewhere (docs/configuration.md)"
        ) from None
    finally:
        engine.dispose()


class RegistryStore:
    """One MLflow tracking store (and model registry): the client, the experiment drafts
    and evaluations are logged to, and the promotions' experiment."""

    def __init__(self, config: RegistryConfig | None = None) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        self.config = config or load_registry_config()
        self.tracking_uri = self.config.resolved_tracking_uri()
        self.registry_uri = self.config.resolved_registry_uri()
        # What messages and printouts name: the store's URI, its password masked.
        self.shown_uri = mask_uri(self.tracking_uri)
        if self.registry_uri != self.tracking_uri:
            self.shown_uri += f" (registry {mask_uri(self.registry_uri)})"
        self._check_reachable()
        mlflow.set_tracking_uri(self.tracking_uri)
        self._mlflow = mlflow
        self.client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.registry_uri)
        try:
            self.experiment_id = self._experiment(self.config.experiment)
            self.promotions_id = self._experiment(f"{self.config.experiment}-promotions")
        except Exception as error:
            raise RegistryError(
                f"cannot use the MLflow tracking store at {self.shown_uri!r}: {_brief(error)}"
            ) from None

    def _check_reachable(self) -> None:
        """One clear error, naming the URI and where it was set, if a store does not answer."""
        stores = {self.tracking_uri: "tracking_uri"}
        stores.setdefault(self.registry_uri, "registry_uri")  # once when they are the same
        for uri, key in stores.items():
            check_store(uri, f"{key}, from {self.config.origin(key)}")

    @contextmanager
    def _store(self, action: str) -> Iterator[None]:
        """Any failure of the store during ``action`` (the server died, the database went
        away) as one :class:`RegistryError` naming the store; specops' own errors pass."""
        try:
            yield
        except (SpecOpsError, TypeError, AttributeError, NameError, AssertionError):
            raise  # specops' own errors, and bugs (their traceback is wanted)
        except Exception as error:
            log.debug("%s failed against %s", action, self.shown_uri, exc_info=True)
            raise RegistryError(
                f"cannot {action}: the MLflow store at {self.shown_uri!r} failed ({_brief(error)})"
            ) from None

    def _experiment(self, name: str) -> str:
        """The experiment ``name``'s id, created if need be: in ``artifact_root`` when one is
        set (or the store is local), else where the tracking server puts artifacts."""
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        root = self.config.resolved_artifact_root()
        location = None if root is None else f"{root.rstrip('/')}/{name}"
        try:
            return self.client.create_experiment(name, artifact_location=location)
        except MlflowException as error:
            if error.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            created = self.client.get_experiment_by_name(name)  # by another replica, meanwhile
            if created is None:
                raise
            return created.experiment_id

    @contextmanager
    def _run(self, **kwargs: Any) -> Iterator[Any]:
        """``mlflow.start_run`` in this registry's store: the fluent API logs to the global
        tracking URI, which another :class:`~registry.client.Registry` (another store) may
        have moved."""
        self._mlflow.set_tracking_uri(self.tracking_uri)
        with self._mlflow.start_run(**kwargs) as run:
            yield run

    def _discard(self, run_id: str, name: str | None = None) -> None:
        """Undo what failed half-way: delete any version of ``name`` made from run
        ``run_id`` (one whose creation answered too late) and the run. Best effort: a
        failure here is logged, never raised over the original error. A store that no
        longer answers is not asked (MLflow's client would retry for minutes): the run,
        which no version points at, is left for deleting by hand."""
        try:
            check_store(self.tracking_uri, "tracking_uri")
        except RegistryError:
            log.warning(
                "the store at %s does not answer; run %s (no version points at it) is left: "
                "delete it once the store is back (mlflow runs delete --run-id %s)",
                self.shown_uri,
                run_id,
                run_id,
            )
            return
        try:
            if name is not None:
                found = self.client.search_model_versions(
                    f"name = '{name}' and run_id = '{run_id}'"
                )
                for mv in found:
                    self.client.delete_model_version(name, mv.version)
        except Exception:
            log.warning(
                "could not look for versions of %s from run %s", name, run_id, exc_info=True
            )
        try:
            self.client.delete_run(run_id)
        except Exception:
            log.warning("could not delete the half-logged run %s", run_id, exc_info=True)
