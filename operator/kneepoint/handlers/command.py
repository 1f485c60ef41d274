"""``kneepoint operator``: run the operator (the Helm chart runs the same entrypoint)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys

import click
import kopf

from kneepoint.settings import OperatorSettings


@click.command("operator")
@click.option("--namespace", "-n", "namespaces", multiple=True, help="Watch only these namespaces (repeatable); default all.")
@click.option("--prometheus-url", default=None, help="Default Prometheus URL for experiments that do not name one.")
@click.option("--image", default=None, help="Image for load-test Jobs and Simulate-mode engines.")
@click.option("--scrape-interval", type=float, default=None, help="Scrape interval of that Prometheus, seconds.")
@click.option("--metrics-port", type=int, default=None, help="Port of the operator's own /metrics (0 disables; default 8080).")
@click.option("--json-logs", is_flag=True, default=False, help="Log one JSON object per line.")
@click.option("--verbose", "-v", is_flag=True, default=False, help="Debug logging.")
def command(
    namespaces: tuple[str, ...],
    prometheus_url: str | None,
    image: str | None,
    scrape_interval: float | None,
    metrics_port: int | None,
    json_logs: bool,
    verbose: bool,
) -> None:
    """Run the kneepoint operator against the current kube context (or in-cluster config)."""
    settings = OperatorSettings.from_env(
        prometheus_url=prometheus_url,
        operator_image=image,
        namespaces=namespaces or None,
        prometheus_scrape_interval_seconds=scrape_interval,
        json_logs=json_logs or None,
        metrics_port=metrics_port,
    )
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
        asyncio.run(
            kopf.operator(
                clusterwide=not settings.namespaces,
                namespaces=list(settings.namespaces),
                standalone=True,
                memo=memo,
            )
        )
    except KeyboardInterrupt:
        sys.exit(0)
    logging.getLogger("kneepoint.operator").info("Operator stopped")
