"""How long the Kubernetes API takes to answer the operator, seen from the operator's side.

A reconcile pass that writes waits for the API server; when passes are slow, a platform team
needs to tell an operator that computes too long from an API server that answers too late.
:func:`time_requests` times every HTTP request an ``ApiClient`` makes, in the worker thread
that makes it (connection, TLS, the server's answer and reading the body; not the wait for a
free worker thread), by HTTP verb as client-go's ``rest_client_request_duration_seconds``
does. A request that fails (an ``ApiException``, a broken connection) is timed too: a slow
504 is exactly what the figure is for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kubernetes import client


def time_requests(api: client.ApiClient, observe: Callable[[str, float], None]) -> None:
    """Make ``api`` call ``observe(verb, seconds)`` after every HTTP request it sends."""
    rest = api.rest_client
    request = rest.request

    def timed(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return request(method, url, *args, **kwargs)
        finally:
            observe(method.upper(), time.perf_counter() - started)

    rest.request = timed
