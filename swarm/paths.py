"""Default locations, shared by the agent's config and the (import-light) client."""

from __future__ import annotations

import os
from pathlib import Path


def default_paths(uid: int) -> tuple[Path, Path]:
    """(state dir, socket) defaults: system paths for root, per-user paths otherwise.

    Per-user paths need no setup: state under $XDG_STATE_HOME/swarm, the socket
    under $XDG_RUNTIME_DIR/swarm/ or a per-user directory in the temp dir.
    """
    if uid == 0:
        return Path("/var/lib/swarm"), Path("/run/swarm/swarm.sock")
    xdg_state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    state = Path(xdg_state) / "swarm"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        sock = Path(runtime) / "swarm" / "swarm.sock"
    else:
        import tempfile  # only here: the CLI starts on every command, tempfile is slow

        sock = Path(tempfile.gettempdir()) / f"swarm-{uid}" / "swarm.sock"
    return state, sock


SYSTEM_SOCKET = Path("/run/swarm/swarm.sock")


def default_socket_path() -> Path:
    """Where a client looks for the agent when nothing says otherwise: $SWARM_SOCKET,
    else the user's own agent if one listens, else the system agent (the systemd
    service) if there is one, else the user's default path (for the error message)."""
    env = os.environ.get("SWARM_SOCKET")
    if env:
        return Path(env)
    own = default_paths(os.getuid())[1]
    if not own.exists() and SYSTEM_SOCKET.exists():
        return SYSTEM_SOCKET
    return own
