"""The sandbox's pod runner: processes for pods on KWOK's simulated nodes (docs/sandbox-runner.md).

``python -m kneepoint.sandbox.runner`` runs :func:`main.main`. Pure modules (no client or
process library, checked by lint-imports): ``plans`` (pod -> argv/env/probes), ``resolve``
(Service names), ``podstatus`` (status patches), ``ipam`` (addresses). The others: ``main``
(entry point, watches), ``pods`` (one pod's life), ``processes`` (child processes, logs),
``probes`` (HTTP/TCP probes), ``kube`` (the only module that calls the API).
"""
