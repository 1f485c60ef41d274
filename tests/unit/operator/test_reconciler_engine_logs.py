"""The reconciler reads a failed engine's log once per failure and records a real does-not-fit.

The engine pod's log is the real vLLM 0.24.0 failure of a 70B model at TP1
(tests/data/vllm/70b-tp1-does-not-fit.log); its termination message is what the kubelet
keeps of it (the last 2048 bytes / 80 lines), which does not name the cause.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fake_cluster import FakeApi, node
from kubernetes.client.rest import ApiException

from kneepoint.reconciler import LOG_READ_ATTEMPTS, Reconciler
from kneepoint.settings import OperatorSettings

NOW = 1_800_000_000.0
REAL_70B = (Path(__file__).resolve().parents[2] / "data" / "vllm" / "70b-tp1-does-not-fit.log").read_text()


def _tail(log: str) -> str:
    return "\n".join(log.encode()[-2048:].decode("utf-8", "replace").splitlines()[-80:])


def _experiment() -> dict[str, Any]:
    # 0.99 lets the estimate deploy TP1; the engine runs under 0.90, as the real capture did.
    return {
        "apiVersion": "kneepoint.io/v1alpha1",
        "kind": "ParallelismExperiment",
        "metadata": {"name": "llama70b", "namespace": "ns", "uid": "uid-llama70b", "generation": 1},
        "spec": {
            "model": {"uri": "hf://meta-llama/Llama-3.3-70B-Instruct", "architecture": {"preset": "llama-3-70b"}, "maxModelLen": 4096},
            "engine": {"gpuMemoryUtilization": 0.99, "extraArgs": ["--gpu-memory-utilization", "0.9"]},
            "load": {"concurrency": 8},
            "tiers": {"tensorParallel": [1]},
            "placement": {"gpuProduct": "NVIDIA-H200"},
        },
    }


class LogApi(FakeApi):
    """The FakeApi with an engine pod that crash-loops and serves ``logs`` (None: the API refuses)."""

    def __init__(self, log: str | None, previous_served: bool = True) -> None:
        super().__init__([node("h200-0")])
        self.log = log
        self.previous_served = previous_served
        self.restarts = 1
        self.log_reads: list[tuple[str, bool]] = []

    async def engine_pods(self, *args: Any) -> list[dict[str, Any]]:
        await self._io("engine_pods")
        if not self.created:
            return []
        return [
            {
                "metadata": {"name": "llama70b-tp1-pp1-abc", "namespace": "ns", "uid": "uid-pod"},
                "spec": {"nodeName": "h200-0"},
                "status": {
                    "conditions": [{"type": "Ready", "status": "False"}],
                    "containerStatuses": [
                        {
                            "name": "engine",
                            "restartCount": self.restarts,
                            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                            "lastState": {
                                "terminated": {
                                    "exitCode": 1,
                                    "reason": "Error",
                                    "message": _tail(REAL_70B),
                                    "containerID": f"containerd://run{self.restarts}",
                                }
                            },
                        }
                    ],
                },
            }
        ]

    async def container_log(
        self, namespace: str, pod: str, container: str, previous: bool, tail_lines: int, limit_bytes: int
    ) -> str | None:
        await self._io("container_log")
        self.log_reads.append((container, previous))
        if previous and not self.previous_served:
            return None
        return self.log

    async def delete_tier(self, *args: Any) -> None:
        await self._io("delete_tier")
        self.created = []


def _run(api: LogApi, passes: int) -> dict[str, Any]:
    api.objects["llama70b"] = _experiment()
    clock = [NOW]
    r = Reconciler(api, api, OperatorSettings(), clock=lambda: clock[0])  # type: ignore[arg-type]

    async def go() -> None:
        for _ in range(passes):
            await r.reconcile("llama70b", "ns")
            clock[0] += 5

    asyncio.run(go())
    return api.objects["llama70b"]["status"]


def test_real_70b_failure_log_records_does_not_fit_with_vllms_line() -> None:
    api = LogApi(REAL_70B)
    status = _run(api, 4)
    (tp1,) = status["tiers"]
    assert tp1["phase"] == "Failed" and tp1["doesNotFit"] is True, tp1
    assert tp1["reason"].startswith("out of memory at start: ValueError: No available memory for the cache blocks"), tp1["reason"]
    # One read for the one failed run: the container's previous log.
    assert api.log_reads == [("engine", True)]


def test_a_failure_is_read_once_however_many_passes_see_it() -> None:
    api = LogApi("INFO starting\n")  # a log without a cause: the tier waits for the crash loop
    _run(api, 6)
    assert api.log_reads == [("engine", True)]


def test_previous_not_served_falls_back_to_the_current_log() -> None:
    api = LogApi(REAL_70B, previous_served=False)
    status = _run(api, 4)
    assert status["tiers"][0]["doesNotFit"] is True
    assert api.log_reads == [("engine", True), ("engine", False)]


def test_no_log_at_all_leaves_the_termination_message_which_names_no_cause() -> None:
    api = LogApi(None)
    status = _run(api, 4)
    tp1 = status["tiers"][0]
    # Not recorded as does-not-fit from the API server's pointer alone; the crash loop goes on.
    assert tp1.get("doesNotFit") is not True and tp1["phase"] == "Deploying", tp1


class FailingLogApi(LogApi):
    """The API server answers the first ``failures`` log reads with 500, as the sandbox's did for a node it had
    lost the address of ("no preferred addresses found; known addresses: []", stop 31's CI)."""

    def __init__(self, log: str | None, failures: int) -> None:
        super().__init__(log)
        self.failures = failures

    async def container_log(
        self, namespace: str, pod: str, container: str, previous: bool, tail_lines: int, limit_bytes: int
    ) -> str | None:
        if self.failures > 0:
            self.failures -= 1
            self.log_reads.append((container, previous))
            raise ApiException(status=500, reason="Internal Server Error")
        return await super().container_log(namespace, pod, container, previous, tail_lines, limit_bytes)


def _passes(api: LogApi, passes: int) -> tuple[dict[str, Any], int]:
    """Like _run, counting the passes that raised (the handler retries them)."""
    api.objects["llama70b"] = _experiment()
    clock = [NOW]
    r = Reconciler(api, api, OperatorSettings(), clock=lambda: clock[0])  # type: ignore[arg-type]
    raised = 0

    async def go() -> None:
        nonlocal raised
        for _ in range(passes):
            try:
                await r.reconcile("llama70b", "ns")
            except ApiException:
                raised += 1
            clock[0] += 5

    asyncio.run(go())
    return api.objects["llama70b"]["status"], raised


def test_a_brief_log_read_error_is_retried_and_the_log_still_decides() -> None:
    api = FailingLogApi(REAL_70B, failures=1)
    status, raised = _passes(api, 5)
    assert raised == 1
    assert status["tiers"][0]["doesNotFit"] is True, status["tiers"][0]
    assert api.log_reads == [("engine", True), ("engine", True)]


def test_a_log_the_api_keeps_failing_is_given_up_after_its_attempts() -> None:
    api = FailingLogApi(REAL_70B, failures=100)
    status, raised = _passes(api, 6)
    # LOG_READ_ATTEMPTS reads raise; the passes before the last one fail and are retried, then the termination
    # message decides alone (it names no cause: the crash loop goes on) and the run's log is not asked again.
    assert raised == LOG_READ_ATTEMPTS - 1
    assert len(api.log_reads) == LOG_READ_ATTEMPTS
    tp1 = status["tiers"][0]
    assert tp1.get("doesNotFit") is not True and tp1["phase"] == "Deploying", tp1
