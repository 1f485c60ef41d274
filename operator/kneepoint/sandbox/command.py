"""``kneepoint sandbox up | down | status | kubeconfig``: the sandbox's command line.

Thin: parses flags and prints; the work is in :mod:`kneepoint.sandbox.controlplane`.
Errors are one line on stderr with exit code 2 (bad input) or 1 (could not start/stop).
"""

from __future__ import annotations

from pathlib import Path

import click

STATE_DIR_HELP = "State directory (default: $KNEEPOINT_SANDBOX_DIR or ~/.cache/kneepoint/sandbox/state)."


def _fail(message: str, code: int = 1) -> None:
    click.echo(f"error: {message}", err=True)
    raise SystemExit(code)


@click.group(name="sandbox")
def command() -> None:
    """Run a local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
    kube-scheduler, KWOK) on loopback with simulated GPU nodes, Prometheus and the pod runner."""


@command.command()
@click.option("--fleet", "fleet_path", type=click.Path(path_type=Path), help="Fleet file (default: deploy/sandbox/fleet.yaml).")
@click.option("--state-dir", type=click.Path(path_type=Path, file_okay=False), help=STATE_DIR_HELP)
@click.option("--port-offset", type=int, default=None, help="Add N to every default port (a second sandbox beside the first).")
@click.option("--no-runner", is_flag=True, help="Do not start the pod runner.")
@click.option("--with-lws", is_flag=True, help="Also run LeaderWorkerSet (multi-node tiers); built on first use, kept by later `up`.")
def up(fleet_path: Path | None, state_dir: Path | None, port_offset: int | None, no_runner: bool, with_lws: bool) -> None:
    """Build what is missing, then start or reuse every component."""
    from kneepoint.sandbox import controlplane, fleet

    if fleet_path is not None and not fleet_path.is_file():
        _fail(f"--fleet {fleet_path}: no such file", 2)
    try:
        if port_offset is not None:
            from kneepoint.sandbox.layout import Ports

            Ports().shifted(port_offset)
        controlplane.up(state_dir, fleet_path, port_offset, with_runner=not no_runner, with_lws=with_lws)
    except ValueError as exc:  # bad --port-offset, bad fleet
        _fail(str(exc), 2)
    except controlplane.SandboxError as exc:
        message = str(exc)
        _fail(message, 2 if message.startswith("--") else 1)
    except fleet.FleetError as exc:
        _fail(str(exc), 2)


@command.command()
@click.option("--state-dir", type=click.Path(path_type=Path, file_okay=False), help=STATE_DIR_HELP)
@click.option("--purge", is_flag=True, help="Also delete the state directory (etcd data, PKI, logs).")
def down(state_dir: Path | None, purge: bool) -> None:
    """Stop every process of the sandbox and verify that none remains."""
    from kneepoint.sandbox import controlplane

    left = controlplane.down(state_dir, purge=purge)
    if left:
        _fail(f"processes still running: {', '.join(left)}")


@command.command()
@click.option("--state-dir", type=click.Path(path_type=Path, file_okay=False), help=STATE_DIR_HELP)
def status(state_dir: Path | None) -> None:
    """Each component's pid, health and memory; the kubeconfig to use."""
    from kneepoint.sandbox import controlplane

    sandbox, rows = controlplane.status(state_dir)
    click.echo(f"{'COMPONENT':<24} {'STATE':<10} {'PID':>7} {'RSS MiB':>8}  HEALTH")
    for row in rows:
        pid = str(row.pid) if row.pid else "-"
        rss = f"{row.rss_bytes / 2**20:.0f}" if row.rss_bytes else "-"
        click.echo(f"{row.name:<24} {row.state:<10} {pid:>7} {rss:>8}  {row.detail}")
    if any(row.state != "stopped" for row in rows):
        total = controlplane.sandbox_rss_bytes(sandbox)
        click.echo(f"total resident memory of the sandbox's processes: {total / 2**20:.0f} MiB")
    click.echo(f"state dir:  {sandbox.paths.root}")
    click.echo(f"kubeconfig: {sandbox.kubeconfig}")
    click.echo(f"prometheus: {sandbox.prometheus_url}")
    click.echo(f"export KUBECONFIG={sandbox.kubeconfig}")
    if any(row.state != "running" for row in rows if row.name not in ("runner", "lws")) or (
        controlplane.lws_expected(sandbox) and any(row.state != "running" for row in rows if row.name == "lws")
    ):
        raise SystemExit(3)


@command.command()
@click.option("--state-dir", type=click.Path(path_type=Path, file_okay=False), help=STATE_DIR_HELP)
def kubeconfig(state_dir: Path | None) -> None:
    """Print the admin kubeconfig's path (use: export KUBECONFIG=$(kneepoint sandbox kubeconfig))."""
    from kneepoint.sandbox import controlplane

    sandbox = controlplane.resolve(state_dir)
    if not sandbox.kubeconfig.exists():
        _fail(f"no kubeconfig at {sandbox.kubeconfig}: run `kneepoint sandbox up` first")
    click.echo(str(sandbox.kubeconfig))
