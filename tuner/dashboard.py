"""`python -m tuner.dashboard [--config PATH]`: optuna-dashboard on a study's store.

Serves the study's storage and its artifact store (each trial's server log), bound to
127.0.0.1 unless told otherwise, and prints the URL; when this runs on a machine you reached
over SSH, it also prints the tunnel command to open it from your own.
"""

from __future__ import annotations

import argparse
import getpass
import os
import socket
import sys

from tuner.cli import error, parser
from tuner.config import DEFAULT_CONFIG, load_config
from tuner.errors import TunerError
from tuner.results.resilient import redacted_url
from tuner.results.storage import existing_storage

__all__ = ["main", "tunnel_command", "build_parser"]


def tunnel_command(port: int, host: str) -> str | None:
    """`ssh -L ...` for a dashboard on a machine reached over SSH (SSH_CONNECTION is set there)."""
    connection = os.environ.get("SSH_CONNECTION", "").split()
    if len(connection) != 4:
        return None
    server_ip, server_port = connection[2], connection[3]
    target = host if host not in ("0.0.0.0", "::") else "127.0.0.1"
    port_flag = f" -p {server_port}" if server_port != "22" else ""
    return f"ssh -N -L {port}:{target}:{port}{port_flag} {getpass.getuser()}@{server_ip}"


def build_parser() -> argparse.ArgumentParser:
    p = parser("tuner.dashboard", "Serve optuna-dashboard on a study's store (every study in it) and its server logs.")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="study config whose store and artifacts are shown")
    p.add_argument("--storage", help="overrides [study] storage (default: the config's)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind; 127.0.0.1 is this machine only")
    p.add_argument("--port", type=int, default=8080, help="port to serve on")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
        url = args.storage or config.storage_url
        storage = existing_storage(config, url, "--storage" if args.storage else None)
        from optuna.artifacts import FileSystemArtifactStore
        from optuna_dashboard import run_server

        store = FileSystemArtifactStore(str(config.artifacts_dir)) if config.artifacts_dir.exists() else None
    except TunerError as exc:
        return error(str(exc))
    with socket.socket() as s:
        try:
            s.bind((args.host, args.port))
        except OSError:
            return error(f"--port {args.port}: in use on {args.host}; pass another --port")
    shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    print(f"optuna-dashboard for {redacted_url(url)} at http://{shown}:{args.port}/dashboard/ (Ctrl-C to stop)", flush=True)
    tunnel = tunnel_command(args.port, args.host)
    if tunnel:
        print(f"from your machine: {tunnel}  then open http://127.0.0.1:{args.port}/dashboard/", flush=True)
    try:
        run_server(storage, host=args.host, port=args.port, artifact_store=store)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
