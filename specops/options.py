"""Option types that several ``specops`` commands share, each declared once with its help;
the drafter-spec and policy help come from the engine's own lists, so they cannot drift."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

# The engine's own lists, from modules that do not import torch (`specops --help` should not
# pay for it, docs/architecture.md).
from serving.engine.drafters.kinds import SPEC_HELP
from serving.engine.policy import POLICIES

POLICY_NAMES = " | ".join(POLICIES)

Drafter = Annotated[str, typer.Option(help=SPEC_HELP)]
Policy = Annotated[str, typer.Option(help=f"Draft-length policy: {POLICY_NAMES}.")]
Threads = Annotated[int, typer.Option(help="torch threads.")]
Target = Annotated[str, typer.Option(help="smollm2 or a local model folder.")]
Hardware = Annotated[str, typer.Option(help="Hardware target (configs/hardware.yaml).")]

# The server's and the vLLM front's access settings (serving.server.config's security).
ApiKeyFile = Annotated[
    Path | None,
    typer.Option(
        help="API keys, one per line (mode 600); also read: $SPECOPS_API_KEYS. Keys are "
        "never taken as command-line values."
    ),
]
AllowUnauthenticated = Annotated[
    bool,
    typer.Option(
        "--allow-unauthenticated",
        help="Serve beyond loopback with no API key (refused otherwise).",
    ),
]


# TLS served by a server itself (serving/security/tls.py), and trusted by a client.
TlsCert = Annotated[
    Path | None,
    typer.Option(help="Serve TLS with this certificate chain (PEM); needs --tls-key."),
]
TlsKey = Annotated[
    Path | None, typer.Option(help="The certificate's private key (PEM, unencrypted, mode 600).")
]
TlsCa = Annotated[
    Path | None,
    typer.Option(help="Reach the server over TLS, trusting this CA file (PEM) to sign its cert."),
]


def security_overrides(
    api_key_file: Path | None,
    allow_unauthenticated: bool,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
) -> dict[str, str | bool | None]:
    """The serving config's keys these options override (``None``: the file's value)."""
    return {
        "security.api_key_file": str(api_key_file) if api_key_file else None,
        "security.allow_unauthenticated": allow_unauthenticated or None,
        "security.tls_cert": str(tls_cert) if tls_cert else None,
        "security.tls_key": str(tls_key) if tls_key else None,
    }
