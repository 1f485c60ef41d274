"""Readiness and startup probes of the sandbox's pod runner, done as the kubelet does them.

Adapter (aiohttp, sockets). ``httpGet``: a GET to the pod's loopback address; any status
200-399 passes (redirects are not followed, as a 3xx already passes). ``tcpSocket``: the
port accepts a connection. ``exec`` and ``grpc`` probes are not run: the sandbox has no
container to exec into and no gRPC health client, so they pass once the process runs (the
runner's documentation says so). Liveness probes are ignored altogether.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress

import aiohttp

from kneepoint.sandbox.runner.plans import ProbeSpec

USER_AGENT = "kube-probe/1.36"


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def probe_once(spec: ProbeSpec, session: aiohttp.ClientSession) -> bool:
    """One attempt of ``spec``; True when it passes. Never dials outside loopback."""
    if spec.action in ("exec", "grpc"):
        return True
    if not _loopback(spec.host) or not 0 < spec.port < 65536:
        return False
    if spec.action == "tcp":
        try:
            _reader, writer = await asyncio.wait_for(asyncio.open_connection(spec.host, spec.port), spec.timeout_seconds)
        except (TimeoutError, OSError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True
    scheme = "https" if spec.scheme == "HTTPS" else "http"
    path = spec.path if spec.path.startswith("/") else "/" + spec.path
    headers = {"User-Agent": USER_AGENT, "Accept": "*/*", **dict(spec.headers)}
    try:
        async with session.get(
            f"{scheme}://{spec.host}:{spec.port}{path}",
            headers=headers,
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=spec.timeout_seconds),
            ssl=False,  # the kubelet does not verify a probe's certificate either
        ) as response:
            return 200 <= response.status < 400
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False
