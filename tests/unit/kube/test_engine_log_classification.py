"""Why a vLLM engine did not start, read from its real log (tests/data/vllm/, real vLLM 0.24.0).

The root cause is in the EngineCore's part of the log; the kubelet's termination message
(``FallbackToLogsOnError``: the last 2048 bytes, at most 80 lines) holds only the API
server's traceback. The log read gives ``doesNotFit``; the termination message alone still
gives a reason that says where the cause is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kneepoint.core.observations import START_CRASH_LOOP, START_OUT_OF_MEMORY
from kneepoint.kube import pod_status

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm"
REAL_70B = (DATA / "70b-tp1-does-not-fit.log").read_text()
ROOT_CAUSE = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"
POINTER = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"


def termination_message(log: str) -> str:
    """What the kubelet keeps with FallbackToLogsOnError: the last 80 lines, at most 2048 bytes."""
    tail = log.encode()[-2048:].decode("utf-8", "replace")
    return "\n".join(tail.splitlines()[-80:])


def crash_looping_pod(message: str, restarts: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "llama70b-tp1-pp1-abc", "uid": "uid-pod"},
        "spec": {"nodeName": "h200-0"},
        "status": {
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {
                    "name": "engine",
                    "restartCount": restarts,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed container"}},
                    "lastState": {
                        "terminated": {
                            "exitCode": 1,
                            "reason": "Error",
                            "message": message,
                            "containerID": "containerd://run1",
                            "finishedAt": "2026-12-01T18:27:12Z",
                        }
                    },
                }
            ],
        },
    }


def test_the_termination_message_of_the_real_failure_lacks_the_root_cause() -> None:
    # The fact the whole change rests on: without the log no out-of-memory marker is seen.
    message = termination_message(REAL_70B)
    assert "No available memory" not in message and POINTER in message


def test_the_real_70b_log_is_out_of_memory_with_vllms_own_line() -> None:
    cause = pod_status.classify_engine_output(REAL_70B)
    assert cause is not None and cause.out_of_memory
    assert cause.line.startswith(ROOT_CAUSE)
    # The figures vLLM printed on the way say by how much.
    assert "Available KV cache memory: -8.06 GiB" in cause.line and "Model loading took 131.45 GiB" in cause.line
    assert len(cause.message()) <= pod_status.REASON_MAX_CHARS


def test_pod_with_the_real_log_is_out_of_memory() -> None:
    pod = crash_looping_pod(termination_message(REAL_70B))
    state = pod_status.engine_state({"metadata": {}}, [pod], {"llama70b-tp1-pp1-abc": REAL_70B})
    assert state.start_failure == START_OUT_OF_MEMORY
    assert (state.failure_message or "").startswith(ROOT_CAUSE)


def test_termination_message_alone_gives_the_api_servers_pointer() -> None:
    # No log (RBAC without pods/log, a node that serves none): the crash loop says where the cause is.
    state = pod_status.engine_state({"metadata": {}}, [crash_looping_pod(termination_message(REAL_70B), restarts=3)])
    assert state.start_failure == START_CRASH_LOOP and state.restarts == 3
    assert state.failure_message == POINTER


def test_a_log_that_could_not_be_read_falls_back_to_the_termination_message() -> None:
    state = pod_status.engine_state({"metadata": {}}, [crash_looping_pod(termination_message(REAL_70B))], {"llama70b-tp1-pp1-abc": None})
    assert state.start_failure == START_CRASH_LOOP and state.failure_message == POINTER


def _tp2_log(root_cause: str) -> str:
    """vLLM's shape with TP > 1 (multiproc executor): the worker's traceback, the EngineCore's pointer, the API server's."""
    return "\n".join(
        [
            "(Worker_TP1 pid=412) INFO 12-01 18:26:14 [model_runner.py:281] Loading model from scratch...",
            "(Worker_TP1 pid=412) ERROR 12-01 18:26:16 [multiproc_executor.py:772] WorkerProc failed to start.",
            "(Worker_TP1 pid=412) ERROR 12-01 18:26:16 [multiproc_executor.py:772] Traceback (most recent call last):",
            '(Worker_TP1 pid=412) ERROR 12-01 18:26:16 [multiproc_executor.py:772]   File "site-packages/vllm/v1/executor/multiproc_executor.py", line 743, in worker_main',
            f"(Worker_TP1 pid=412) ERROR 12-01 18:26:16 [multiproc_executor.py:772] {root_cause}",
            "(EngineCore pid=300) ERROR 12-01 18:26:20 [core.py:1231] EngineCore failed to start.",
            "(EngineCore pid=300) ERROR 12-01 18:26:20 [core.py:1231] Exception: WorkerProc initialization failed due to an exception "
            "in a background process. See stack trace for root cause.",
            "(APIServer pid=200) Traceback (most recent call last):",
            f"(APIServer pid=200) {POINTER}",
        ]
    )


def test_tp2_worker_out_of_memory_is_read_from_the_workers_lines() -> None:
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 1 has a total capacity of 139.81 GiB"
    cause = pod_status.classify_engine_output(_tp2_log(oom))
    assert cause is not None and cause.out_of_memory and cause.line == oom


def test_tp2_worker_failure_that_is_not_memory_names_the_workers_exception_not_the_pointer() -> None:
    cause = pod_status.classify_engine_output(_tp2_log("KeyError: 'model.layers.0.self_attn.qkv_proj.weight'"))
    assert cause is not None and not cause.out_of_memory
    assert cause.line == "KeyError: 'model.layers.0.self_attn.qkv_proj.weight'"


def test_kv_pool_too_small_for_max_model_len_is_out_of_memory() -> None:
    line = (
        "ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, "
        "which is larger than the available KV cache memory (9.50 GiB). Based on the available memory, the estimated maximum "
        "model length is 77824. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
    )
    cause = pod_status.classify_engine_output(f"(EngineCore pid=3) ERROR 12-01 18:27:09 [core.py:1231] {line}\n")
    assert cause is not None and cause.out_of_memory and cause.line == line


def test_failed_runs_name_the_run_to_read_once() -> None:
    terminated = crash_looping_pod("x")
    cs = terminated["status"]["containerStatuses"][0]
    cs["state"] = {"terminated": cs.pop("lastState")["terminated"]}
    (first,) = pod_status.failed_engine_runs([terminated], "engine")
    assert (first.pod, first.container, first.previous) == ("llama70b-tp1-pp1-abc", "engine", False)
    # The same run after the kubelet restarted the container: read with previous, the same key.
    (again,) = pod_status.failed_engine_runs([crash_looping_pod("x")], "engine")
    assert again.previous is True and again.key == first.key


def test_no_read_for_ready_clean_or_deleted_pods_or_other_containers() -> None:
    ready = crash_looping_pod("x")
    ready["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    clean = crash_looping_pod("x")
    clean["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] = 0
    deleted = crash_looping_pod("x")
    deleted["metadata"]["deletionTimestamp"] = "2026-12-01T18:30:00Z"
    running = crash_looping_pod("x")
    running["status"]["containerStatuses"][0]["lastState"] = {}
    running["status"]["containerStatuses"][0]["state"] = {"running": {}}
    assert pod_status.failed_engine_runs([ready, clean, deleted, running], "engine") == []
    assert pod_status.failed_engine_runs([crash_looping_pod("x")], "sidecar") == []
