"""A local team stack on loopback, started and stopped by one command (``scripts/stack.sh``).

The services a team runs on shared servers, each a real server process:

- **PostgreSQL** (Debian's package): a private cluster under the stack's folder, owned by
  the ``postgres`` user when run as root; databases ``mlflow`` and ``prefect``.
- **MLflow** tracking server on that database with proxied artifacts (``--serve-artifacts``):
  clients never write to the artifact folder themselves, so any host that reaches the
  server can read every version.
- **Prefect** server on that database, a ``process`` work pool, one global concurrency
  limit per hardware target around promotion, the automations that recover a flow run
  whose worker died (:mod:`tasks.ops.prefect_setup`), and a worker polling the pool.
- **sshd** serving the DVC remote's folder (DVC's ``ssh://`` remote, key authentication).

Nothing here is specops-specific but the names: the same code runs against these services
or against a team's own, and only the URIs differ (``scripts/stack.sh env`` prints them).
Each ``up`` step is idempotent: a running service is left alone; a stopped one starts on
its existing state. ``down`` stops everything and keeps the state; ``down --purge`` also
deletes it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tasks.ops.stack_config import StackConfig
from tasks.ops.stack_process import (
    StackError,
    alive,
    apt_install,
    as_root,
    console_script,
    http_ok,
    inherited_env,
    run_command,
    wait_for,
)

log = logging.getLogger(__name__)

SERVICES = ("postgres", "mlflow", "prefect", "worker", "sshd")


@dataclass
class Started:
    name: str
    seconds: float  # how long its step took (a check only, when it was already running)
    already: bool


class Stack:
    def __init__(self, config: StackConfig | None = None) -> None:
        self.config = config or StackConfig()

    # --- bookkeeping ------------------------------------------------------------------
    def _pidfile(self, name: str) -> Path:
        return self.config.run / f"{name}.pid"

    def pid(self, name: str) -> int | None:
        """The service's main process, when it runs."""
        if name == "postgres":
            postmaster = self._pg_data / "postmaster.pid"
            path = postmaster if postmaster.is_file() else None
        else:
            path = self._pidfile(name) if self._pidfile(name).is_file() else None
        if path is None:
            return None
        try:
            pid = int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if alive(pid) else None

    def _spawn(self, name: str, command: list[str], env: dict[str, str]) -> int:
        self.config.logs.mkdir(parents=True, exist_ok=True)
        self.config.run.mkdir(parents=True, exist_ok=True)
        with open(self.config.logs / f"{name}.log", "a") as log_file:
            process = subprocess.Popen(
                command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**inherited_env(), **env},
                cwd=self.config.state,
                start_new_session=True,  # its own process group: `down` stops the whole tree
            )
        self._pidfile(name).write_text(str(process.pid))
        return process.pid

    def _serve(self, name: str, command: list[str], env: dict[str, str], *, health: str) -> None:
        """Start an HTTP service and wait until ``health`` answers 200."""
        self._spawn(name, command, env)
        wait_for(
            lambda: http_ok(health),
            timeout_s=self.config.ready_timeout_s,
            what=f"the {name} server ({health})",
            log_file=self.config.logs / f"{name}.log",
        )

    def _stop_group(self, name: str, timeout_s: float = 30.0) -> bool:
        pid = self.pid(name)
        if pid is None:
            self._pidfile(name).unlink(missing_ok=True)
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.2)
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        self._pidfile(name).unlink(missing_ok=True)
        return True

    # --- PostgreSQL -------------------------------------------------------------------
    @functools.cached_property
    def _pg_home(self) -> Path:
        """The cluster's folder: under the stack's state, unless (run as root) the postgres
        user cannot reach it (a root-only temporary folder): then under that user's home,
        ``/var/lib/postgresql/specops-<digest of the state path>``."""
        inside = self.config.state / "postgres"
        if not as_root():
            return inside
        probe = self.config.state  # folders still to be made get mode 0755: reachable
        while not probe.exists():
            probe = probe.parent
        reach = subprocess.run(
            ["runuser", "-u", "postgres", "--", "test", "-x", str(probe)], capture_output=True
        )
        if reach.returncode == 0:
            return inside
        digest = hashlib.sha256(str(self.config.state).encode()).hexdigest()[:12]
        return Path("/var/lib/postgresql") / f"specops-{digest}"

    @property
    def _pg_data(self) -> Path:
        return self._pg_home / "data"

    def _pg_bin(self, name: str) -> str:
        found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
        if not found:
            raise StackError(f"PostgreSQL's {name} is missing: apt-get install postgresql")
        return str(found[-1])

    def _as_postgres(self, command: list[str]) -> list[str]:
        """PostgreSQL refuses to run as root: as root, run it as the ``postgres`` user."""
        return ["runuser", "-u", "postgres", "--", *command] if as_root() else command

    def _chown_postgres(self, path: Path) -> None:
        if as_root():
            shutil.chown(path, "postgres", "postgres")

    def _postgres_up(self) -> None:
        apt_install("postgresql", "/usr/lib/postgresql")
        config = self.config
        config.secrets.mkdir(parents=True, exist_ok=True, mode=0o700)
        password_file = config.secrets / "db-password"
        if not password_file.exists():
            password_file.write_text(secrets.token_urlsafe(24))
            password_file.chmod(0o600)
        self._pg_home.mkdir(parents=True, exist_ok=True)
        self._chown_postgres(self._pg_home)
        if not (self._pg_data / "PG_VERSION").is_file():
            # initdb reads the superuser's password from a file the postgres user can read.
            pwfile = self._pg_home / ".pw"
            pwfile.write_text(config.db_password())
            pwfile.chmod(0o600)
            self._chown_postgres(pwfile)
            initdb = [
                self._pg_bin("initdb"), "-D", str(self._pg_data), "-U", config.db_user,
                f"--pwfile={pwfile}", "--auth=scram-sha-256", "--encoding=UTF8",
            ]  # fmt: skip
            try:
                run_command(self._as_postgres(initdb), what="initdb")
            finally:
                pwfile.unlink(missing_ok=True)
        if self.pid("postgres") is None:
            options = (
                f"-p {config.postgres_port} -c listen_addresses={config.host} -k {self._pg_home}"
            )
            pg_ctl = [
                self._pg_bin("pg_ctl"), "-D", str(self._pg_data),
                "-l", str(self._pg_home / "postgres.log"), "-o", options, "-w", "start",
            ]  # fmt: skip
            run_command(self._as_postgres(pg_ctl), what="pg_ctl start")
        self._create_databases("mlflow", "prefect")

    def _create_databases(self, *names: str) -> None:
        import psycopg2

        try:
            connection = psycopg2.connect(
                host=self.config.host,
                port=self.config.postgres_port,
                user=self.config.db_user,
                password=self.config.db_password(),
                dbname="postgres",
                connect_timeout=10,
            )
        except psycopg2.OperationalError as error:
            raise StackError(
                f"cannot connect to PostgreSQL at {self.config.host}:"
                f"{self.config.postgres_port}: {error}"
            ) from None
        connection.autocommit = True
        try:
            with connection.cursor() as cursor:
                for name in names:
                    cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                    if cursor.fetchone() is None:
                        cursor.execute(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()

    def _postgres_down(self) -> bool:
        if self.pid("postgres") is None:
            return False
        run_command(
            self._as_postgres(
                [self._pg_bin("pg_ctl"), "-D", str(self._pg_data), "-m", "fast", "-w", "stop"]
            ),
            what="pg_ctl stop",
        )
        return True

    # --- MLflow -----------------------------------------------------------------------
    def _mlflow_up(self) -> None:
        config = self.config
        if self.pid("mlflow") is not None:
            return
        config.artifacts.mkdir(parents=True, exist_ok=True)
        command = [
            console_script("mlflow"), "server",
            "--backend-store-uri", config.database_uri("mlflow"),
            "--serve-artifacts",
            "--artifacts-destination", config.artifacts.as_uri(),
            "--host", config.host,
            "--port", str(config.mlflow_port),
            "--workers", "1",
        ]  # fmt: skip
        # One worker and no job runner: 0.4 GB instead of ~1.9 GB (docs/ENVIRONMENT facts).
        env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self._serve("mlflow", command, env, health=f"{config.mlflow_uri}/health")

    # --- Prefect ----------------------------------------------------------------------
    def prefect_env(self) -> dict[str, str]:
        return {
            "PREFECT_API_URL": self.config.prefect_api_url,
            "PREFECT_HOME": str(self.config.state / "prefect-home"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        }

    def _prefect_up(self) -> None:
        config = self.config
        if self.pid("prefect") is None:
            env = {
                **self.prefect_env(),
                "PREFECT_API_DATABASE_CONNECTION_URL": config.database_uri(
                    "prefect", driver="asyncpg"
                ),
            }
            env.pop("PREFECT_API_URL")  # the server itself is not a client of an API
            command = [
                console_script("prefect"), "server", "start",
                "--host", config.host, "--port", str(config.prefect_port),
            ]  # fmt: skip
            self._serve("prefect", command, env, health=f"{config.prefect_api_url}/health")
        from tasks.ops.prefect_setup import prepare_prefect

        prepare_prefect(config.pool, env=self.prefect_env())

    def _worker_up(self, env: dict[str, str] | None = None) -> None:
        config = self.config
        if self.pid("worker") is not None:
            return
        command = [
            console_script("prefect"), "worker", "start",
            "--pool", config.pool, "--type", "process",
            "--name", f"{config.pool}-{os.uname().nodename}",
        ]  # fmt: skip
        worker_env = {
            **self.prefect_env(),
            **config.client_env(),
            "PREFECT_WORKER_QUERY_SECONDS": str(config.worker_poll_s),
            # Flow runs send heartbeats; a run whose heartbeats stop (its worker died) is
            # marked crashed and rescheduled by the automations of tasks.ops.prefect_setup.
            "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30",
            **(env or {}),
        }
        log_file = config.logs / "worker.log"
        # The log is appended to across restarts: only what this worker writes counts.
        offset = log_file.stat().st_size if log_file.is_file() else 0
        self._spawn("worker", command, worker_env)
        wait_for(
            lambda: b"started" in log_file.read_bytes()[offset:],
            timeout_s=config.ready_timeout_s,
            what=f"the Prefect worker of pool {config.pool!r}",
            log_file=log_file,
        )

    def restart_worker(self, env: dict[str, str] | None = None) -> None:
        self._stop_group("worker")
        self._worker_up(env)

    # --- sshd for the DVC remote ------------------------------------------------------
    def _sshd_up(self) -> None:
        apt_install("openssh-server", "/usr/sbin/sshd")
        config = self.config
        if self.pid("sshd") is not None:
            return
        config.secrets.mkdir(parents=True, exist_ok=True, mode=0o700)
        config.dvc_remote.mkdir(parents=True, exist_ok=True)
        host_key = config.secrets / "ssh_host_ed25519"
        for key in (host_key, config.ssh_key):
            if not key.exists():
                run_command(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                    what="ssh-keygen",
                )
        authorized = config.secrets / "authorized_keys"
        authorized.write_text(config.ssh_key.with_suffix(".pub").read_text())
        authorized.chmod(0o600)
        sshd_config = config.state / "sshd_config"
        sshd_config.write_text(
            "\n".join(
                [
                    f"Port {config.ssh_port}",
                    f"ListenAddress {config.host}",
                    f"HostKey {host_key}",
                    f"AuthorizedKeysFile {authorized}",
                    f"PidFile {self._pidfile('sshd')}",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "UsePAM no",
                    # The keys live in the project's folder, whose modes sshd cannot vouch for.
                    "StrictModes no",
                    "Subsystem sftp internal-sftp",
                    "",
                ]
            )
        )
        if as_root():
            Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation folder
        config.run.mkdir(parents=True, exist_ok=True)
        run_command(
            ["/usr/sbin/sshd", "-f", str(sshd_config), "-E", str(config.logs / "sshd.log")],
            what="sshd",
        )
        wait_for(
            lambda: self.pid("sshd") is not None,
            timeout_s=30,
            what="sshd",
            log_file=config.logs / "sshd.log",
        )

    def configure_dvc(self, repo: Path) -> None:
        """Name the stack's remote ``team`` in ``repo``'s machine-local DVC config
        (``.dvc/config.local``, never committed): ``dvc push -r team`` then pushes over SSH."""
        config = self.config
        dvc = console_script("dvc")
        steps = [
            ["remote", "add", "--local", "--force", "team", config.dvc_remote_url],
            ["remote", "modify", "--local", "team", "keyfile", str(config.ssh_key)],
        ]
        for step in steps:
            done = subprocess.run([dvc, *step], cwd=repo, capture_output=True, text=True)
            if done.returncode != 0:
                raise StackError(f"`dvc {' '.join(step[:3])}` failed: {done.stderr.strip()}")

    # --- the whole stack --------------------------------------------------------------
    def up(self, *, repo: Path | None = None, worker_env: dict[str, str] | None = None) -> list:
        steps = {
            "postgres": self._postgres_up,
            "mlflow": self._mlflow_up,
            "prefect": self._prefect_up,
            "worker": lambda: self._worker_up(worker_env),
            "sshd": self._sshd_up,
        }
        started = []
        for name, step in steps.items():
            already = self.pid(name) is not None
            start = time.perf_counter()
            step()
            started.append(Started(name, time.perf_counter() - start, already))
            log.info("%s %s", name, "running" if already else "started")
        if repo is not None:
            self.configure_dvc(repo)
        self._write_env()
        return started

    def down(self, *, purge: bool = False) -> list[str]:
        stopped = [name for name in ("worker", "prefect", "mlflow") if self._stop_group(name)]
        sshd = self.pid("sshd")
        if sshd is not None:
            os.kill(sshd, signal.SIGTERM)
            self._pidfile("sshd").unlink(missing_ok=True)
            stopped.append("sshd")
        if self._postgres_down():
            stopped.append("postgres")
        if purge:
            if self._pg_home.exists() and not self._pg_home.is_relative_to(self.config.state):
                shutil.rmtree(self._pg_home)
            if self.config.state.exists():
                shutil.rmtree(self.config.state)
        return stopped

    def status(self) -> dict[str, dict]:
        """Each service: running or not, its pid and the memory of its process tree (MiB):
        proportional set size, so pages the processes share (PostgreSQL's buffers) count
        once; resident size where PSS cannot be read."""
        import psutil

        def memory(process: psutil.Process) -> int:
            try:
                return int(process.memory_full_info().pss)
            except (psutil.AccessDenied, AttributeError):
                return int(process.memory_info().rss)

        report = {}
        for name in SERVICES:
            pid = self.pid(name)
            mib = None
            if pid is not None:
                try:
                    root = psutil.Process(pid)
                    tree = [root, *root.children(recursive=True)]
                    mib = sum(memory(p) for p in tree if p.is_running()) / 2**20
                except psutil.Error:
                    mib = None
            report[name] = {"running": pid is not None, "pid": pid, "memory_mib": mib}
        return report

    def _write_env(self) -> None:
        """``<root>/stack.env``: the client settings, to ``source``."""
        lines = [f"export {k}={v}" for k, v in self.config.client_env().items()]
        (self.config.state / "stack.env").write_text("\n".join(lines) + "\n")
