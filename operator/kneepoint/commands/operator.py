"""``kneepoint operator``: run the operator (the Helm chart runs the same entrypoint).

Before kopf starts, the process takes part in leader election on a Lease for its scope
(kube/leader_election.py): a standby waits, saying so once, and only the leader runs kopf.
A leader that misses its renew deadline stops at once (its writes are fenced before that)
and starts over as a standby: the process replaces itself (exec), so nothing of the old
leadership survives in memory, and the GPU ledger and wait queue are rebuilt from the
cluster as at any start. An API server that restarts therefore costs a takeover, not the
operator (``--exit-on-lost-lease`` exits with status 3 instead, for a supervisor that
restarts it). On a clean stop (SIGTERM, Ctrl-C) it releases the Lease so a standby takes over at its next
retry. kopf's own peering stays off (standalone): the Lease is the one election.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
from typing import Any

import click
import kopf

from kneepoint.settings import OperatorSettings

log = logging.getLogger("kneepoint.operator")
LOST_EXIT_CODE = 3
"""Exit status of a leader that lost its Lease under ``--exit-on-lost-lease``."""


def _start_over(lease_namespace: str) -> None:
    """Replace this process with a fresh ``kneepoint operator`` of the same arguments: a standby again.

    The Lease's namespace is handed on (its option's variable), so the new process need not look it up
    while the API server may still be away.
    """
    os.environ["KNEEPOINT_LEASE_NAMESPACE"] = lease_namespace
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    os.execv(sys.executable, [sys.executable, *argv[1:]])


async def _find_lease_namespace(le: Any, api: Any, name: str) -> str | None:
    """``find_lease_namespace``, retried while the API server cannot be reached (a start during its restart)."""
    delay = 1.0
    while True:
        try:
            return await asyncio.to_thread(le.find_lease_namespace, api, name)
        except Exception as exc:  # noqa: BLE001 - urllib3's connection errors: wait for the API server, as the election does
            log.warning("Looking up the Lease %s failed (%s); retrying in %.0f s", name, type(exc).__name__, delay)
            await asyncio.sleep(delay)
            delay = min(30.0, delay * 2)


def _election_client() -> Any:
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CoordinationV1Api(client.ApiClient(client.Configuration.get_default_copy()))


def _context_namespace() -> str | None:
    from kubernetes import config

    try:
        _, active = config.list_kube_config_contexts()
    except Exception:  # noqa: BLE001 - in-cluster, or no kubeconfig
        return None
    return (active or {}).get("context", {}).get("namespace")


async def _lead_then_operate(settings: OperatorSettings, memo: kopf.Memo, lease_namespace: str | None, exit_on_loss: bool) -> None:
    from kneepoint.handlers.experiment import serve_metrics
    from kneepoint.kube import leader_election as le
    from kneepoint.operator_metrics import OperatorMetrics

    timing = le.timing_from_env()
    api = _election_client()
    name = le.lease_name(settings.namespaces)
    namespace = (
        lease_namespace
        or le.in_cluster_namespace()
        # A local process joins the election of an install that already runs (the chart's namespace).
        or await _find_lease_namespace(le, api, name)
        or _context_namespace()
        or "default"
    )
    # /metrics before the election: a standby is Ready too (the chart's readiness probe, its PDB).
    metrics = memo.metrics = OperatorMetrics()
    serve_metrics(metrics, settings)
    metrics.leader.set(0)
    elector = le.LeaseElector(api, namespace, name, le.default_identity(), timing, le.scope_text(settings.namespaces))
    scope = ",".join(settings.namespaces) or "all namespaces"

    def standby(holder: str | None) -> None:
        log.warning(
            "Standby: Lease %s/%s (scope: %s) is held by %s; this process takes over if that one stops renewing it "
            "(use --namespace to run an operator of its own scope)",
            namespace,
            name,
            scope,
            holder,
        )

    await elector.acquire(on_standby=standby)
    metrics.leader.set(1)
    log.info("Leading: Lease %s/%s (scope: %s) as %s", namespace, name, scope, elector.identity)
    memo.elector = elector
    operator = asyncio.ensure_future(
        kopf.operator(
            clusterwide=not settings.namespaces,
            namespaces=list(settings.namespaces),
            standalone=True,
            memo=memo,
        )
    )
    hold = asyncio.ensure_future(elector.hold())
    while True:
        done, _ = await asyncio.wait({operator, hold}, return_when=asyncio.FIRST_COMPLETED)
        if operator in done:
            break
        if hold.cancelled():
            # Cancelled from outside (kopf cancels the loop's other tasks while it stops): renew until it has stopped.
            hold = asyncio.ensure_future(elector.hold())
            continue
        # The fence already refuses our writes; exiting now also stops kopf's own (finalizers, annotations).
        if exit_on_loss:
            log.error("Lost the leadership of Lease %s/%s: exiting without another write", namespace, name)
            logging.shutdown()
            os._exit(LOST_EXIT_CODE)
        log.error("Lost the leadership of Lease %s/%s: starting over as a standby without another write", namespace, name)
        logging.shutdown()
        _start_over(namespace)
    hold.cancel()
    if await elector.release_after_renewals():
        log.info("Released Lease %s/%s", namespace, name)
    operator.result()


@click.command("operator")
@click.option(
    "--namespace",
    "-n",
    "namespaces",
    multiple=True,
    help="Watch only these namespaces (repeatable; glob patterns as kopf's); default all. The scope names the "
    "Lease, so an operator of another scope does not wait for this one.",
)
@click.option(
    "--lease-namespace",
    default=None,
    envvar="KNEEPOINT_LEASE_NAMESPACE",
    help="Namespace of the leader-election Lease (default: the pod's own in a cluster; locally, that of an "
    "existing Lease of the same scope, else the kube context's namespace).",
)
@click.option(
    "--exit-on-lost-lease",
    is_flag=True,
    default=False,
    envvar="KNEEPOINT_EXIT_ON_LOST_LEASE",
    help="A leader that loses its Lease exits with status 3 (for a supervisor that restarts it) instead of "
    "starting over in place as a standby.",
)
@click.option("--prometheus-url", default=None, help="Default Prometheus URL for experiments that do not name one.")
@click.option("--image", default=None, help="Image for load-test Jobs and Simulate-mode engines.")
@click.option("--scrape-interval", type=float, default=None, help="Scrape interval of that Prometheus, seconds.")
@click.option("--metrics-port", type=int, default=None, help="Port of the operator's own /metrics (0 disables; default 8080).")
@click.option("--json-logs", is_flag=True, default=False, help="Log one JSON object per line.")
@click.option("--verbose", "-v", is_flag=True, default=False, help="Debug logging.")
def command(
    namespaces: tuple[str, ...],
    lease_namespace: str | None,
    exit_on_lost_lease: bool,
    prometheus_url: str | None,
    image: str | None,
    scrape_interval: float | None,
    metrics_port: int | None,
    json_logs: bool,
    verbose: bool,
) -> None:
    """Run the kneepoint operator against the current kube context (or in-cluster config)."""
    from kneepoint.kube.leader_election import timing_from_env

    try:
        settings = OperatorSettings.from_env(
            prometheus_url=prometheus_url,
            operator_image=image,
            namespaces=namespaces or None,
            prometheus_scrape_interval_seconds=scrape_interval,
            json_logs=json_logs or None,
            metrics_port=metrics_port,
        )
        timing_from_env()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    from kneepoint.handlers import logs

    logs.configure(json_lines=settings.json_logs, verbose=verbose)
    from kneepoint.handlers import prometheus_default

    named = prometheus_url is not None or "KNEEPOINT_PROMETHEUS_URL" in os.environ
    choice = prometheus_default.choose(settings.prometheus_url, named)
    if choice.note:
        logging.getLogger("kneepoint.operator").warning("%s", choice.note)
    if choice.url != settings.prometheus_url:
        settings = dataclasses.replace(settings, prometheus_url=choice.url)
    import kneepoint.handlers.experiment  # noqa: F401  (registers the handlers)

    memo = kopf.Memo(operator_settings=settings)
    try:
        asyncio.run(_lead_then_operate(settings, memo, lease_namespace, exit_on_lost_lease))
    except KeyboardInterrupt:
        sys.exit(0)
    log.info("Operator stopped")
