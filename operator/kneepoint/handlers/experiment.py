"""kopf handlers for ParallelismExperiment: thin on purpose (the reconciler decides).

One daemon per experiment runs reconcile passes. It sleeps until the ladder's requested
delay, or until an event on one of the experiment's children (engine pods, Deployments,
load-test Jobs) or a spec change wakes it, so nothing polls the API in a tight loop. Every
object those watches deliver goes into the reader's cache first (``kube.child_cache``), so the
pass it wakes reads it from there instead of the API.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf
from kubernetes import client, config

from kneepoint.kube import child_cache, naming
from kneepoint.kube.api_timing import time_requests
from kneepoint.kube.child_cache import ChildCache
from kneepoint.kube.child_reader import ChildReader
from kneepoint.kube.child_writer import ChildWriter
from kneepoint.operator_metrics import OperatorMetrics
from kneepoint.reconciler import Reconciler
from kneepoint.settings import OperatorSettings

log = logging.getLogger("kneepoint.operator")
ERROR_BACKOFF_SECONDS = 10.0


def _api_client(pool_size: int) -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = pool_size  # one connection per worker thread, none waits for another's
    return client.ApiClient(configuration)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Our own progress lives in status; kopf's bookkeeping goes to annotations under our prefix.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=naming.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=naming.GROUP, key="last-handled-configuration")
    settings.persistence.finalizer = f"{naming.GROUP}/finalizer"
    # We post our own, specific events; kopf's generic "Handler succeeded" ones are noise.
    settings.posting.enabled = False
    settings.watching.server_timeout = 300
    operator_settings: OperatorSettings = memo.get("operator_settings") or OperatorSettings.from_env()
    # The reader and writer run the synchronous client in worker threads (asyncio.to_thread).
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=operator_settings.api_threads, thread_name_prefix="kneepoint-api")
    )
    api = _api_client(operator_settings.api_threads)
    memo.operator_settings = operator_settings
    # `kneepoint operator` serves /metrics before the election (a standby is Ready too); else serve here.
    served = memo.get("metrics")
    metrics = served or OperatorMetrics()
    time_requests(api, lambda verb, seconds: metrics.api_latency.labels(verb).observe(seconds))
    count = metrics.api_requests
    elector = memo.get("elector")  # set by `kneepoint operator` once it leads; absent in tools that drive kopf themselves
    memo.cache = cache = ChildCache()
    memo.reconciler = Reconciler(
        ChildReader(api, on_request=lambda method: count.labels(method).inc(), cache=cache),
        ChildWriter(api, on_request=lambda method: count.labels(method).inc(), fence=elector.fence if elector else None, cache=cache),
        operator_settings,
        metrics=metrics,
        on_ready=lambda namespace, name: _wake_if_running(memo, namespace, name),
    )
    if served is None:
        serve_metrics(metrics, operator_settings)
    memo.wakeups = {}
    log.info(
        "Operator started: Prometheus %s, image %s, namespaces %s",
        operator_settings.prometheus_url,
        operator_settings.operator_image,
        ",".join(operator_settings.namespaces) or "all",
    )


def serve_metrics(metrics: OperatorMetrics, settings: OperatorSettings) -> None:
    try:
        metrics.serve(settings.metrics_port, settings.metrics_address)
    except OSError as exc:
        log.warning("Operator metrics not served on port %d: %s", settings.metrics_port, exc)


def _wakeup(memo: kopf.Memo, namespace: str, experiment: str) -> asyncio.Event:
    return memo.wakeups.setdefault((namespace, experiment), asyncio.Event())


def _wake_if_running(memo: kopf.Memo, namespace: str, experiment: str) -> None:
    """Wake an experiment's daemon (none left, none made: the experiment may be gone)."""
    wake = memo.wakeups.get((namespace, experiment))
    if wake is not None:
        wake.set()


async def _sleep(wake: asyncio.Event, stopped: Any, seconds: float) -> None:
    """Until ``seconds`` pass (math.inf: no deadline), the wake-up event is set, or the daemon is stopped.

    Waits on the event in 1 s slices only to notice ``stopped``; no API call is made here.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not stopped and not wake.is_set():
        remaining = deadline - loop.time()
        if remaining <= 0:
            return
        try:
            await asyncio.wait_for(wake.wait(), timeout=min(remaining, 1.0))
        except TimeoutError:
            pass


@kopf.daemon(naming.GROUP, naming.VERSION, naming.PLURAL, cancellation_timeout=5.0, initial_delay=0)
async def run_experiment(name: str, namespace: str | None, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """Drive one experiment through its ladder until it is deleted."""
    assert namespace is not None  # the resource is namespaced
    reconciler: Reconciler = memo.reconciler
    wake = _wakeup(memo, namespace, name)
    backoff = ERROR_BACKOFF_SECONDS
    while not stopped:
        wake.clear()
        try:
            delay = await reconciler.reconcile(name, namespace)
            backoff = ERROR_BACKOFF_SECONDS
        except Exception:  # the API server restarting, a 409 on status: try again later
            log.exception("%s/%s: reconcile failed; retrying in %.0f s", namespace, name, backoff)
            # Capped at a minute: after an API server outage the operator resumes within a minute.
            delay, backoff = backoff, min(backoff * 2, 60.0)
        # None: Decided, Failed or rejected; only an event (spec change, child change) wakes it.
        await _sleep(wake, stopped, math.inf if delay is None else delay)
    memo.wakeups.pop((namespace, name), None)


def _remember(memo: kopf.Memo, kind: str, event: Mapping[str, Any]) -> None:
    """The watch event's object into the reader's cache (a DELETED one out of it)."""
    cache: ChildCache | None = getattr(memo, "cache", None)
    obj = event.get("object")
    if cache is None or not isinstance(obj, Mapping):
        return
    if event.get("type") == "DELETED":
        cache.drop(kind, obj)
    else:
        cache.offer(kind, obj)


def _wake_owner(memo: kopf.Memo, namespace: str, labels: Mapping[str, str]) -> None:
    experiment = labels.get(naming.LABEL_EXPERIMENT)
    if experiment and hasattr(memo, "wakeups"):
        event = memo.wakeups.get((namespace, experiment))
        if event is not None:
            event.set()


@kopf.on.event("", "v1", "pods", labels={naming.LABEL_ROLE: kopf.PRESENT})
@kopf.on.event("apps", "v1", "deployments", labels={naming.LABEL_ROLE: naming.ROLE_ENGINE})
@kopf.on.event("batch", "v1", "jobs", labels={naming.LABEL_ROLE: naming.ROLE_LOADTEST})
async def child_changed(
    namespace: str | None, labels: Mapping[str, str], memo: kopf.Memo, event: Mapping[str, Any], resource: Any, **_: Any
) -> None:
    """A child changed: into the cache, then wake its experiment's daemon instead of waiting for the next poll.

    Async, so it runs on the event loop with the passes that read the cache (kopf runs a plain function in a
    worker thread)."""
    assert namespace is not None  # only namespaced kinds are watched
    _remember(memo, resource.plural, event)
    _wake_owner(memo, namespace, labels)


@kopf.on.event(naming.GROUP, naming.VERSION, naming.PLURAL)
async def experiment_changed(name: str, namespace: str | None, body: Any, memo: kopf.Memo, event: Mapping[str, Any], **_: Any) -> None:
    """Into the cache (the next pass reads it from there; async: on the loop, as child_changed); a spec change
    (new generation) wakes the daemon at once."""
    _remember(memo, child_cache.EXPERIMENTS, event)
    generation = body.get("metadata", {}).get("generation")
    observed = (body.get("status") or {}).get("observedGeneration")
    if generation != observed and hasattr(memo, "wakeups"):
        wake = memo.wakeups.get((namespace, name))
        if wake is not None:
            wake.set()
