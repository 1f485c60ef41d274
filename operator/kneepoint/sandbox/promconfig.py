"""Prometheus configuration for the sandbox (pure: returns the config as a dict).

Scrapes what runs in the sandbox: the control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, KWOK), Prometheus itself, and engine pods found
by Kubernetes service discovery (role pod, through the admin kubeconfig):

- job ``vllm``: pods labelled ``kneepoint.io/role=engine``, their container port named
  ``http``, path /metrics (vLLM's metrics);
- job ``trace``: the same pods' trace sidecar, the container port named ``trace-metrics``
  (``kneepoint_comm_fraction``, ``kneepoint_rank_skew_fraction``; docs/trace.md);
- job ``dcgm``: the same pods at ``<podIP>:9400`` /metrics (DCGM-exporter metrics; the
  simulator serves them on the pod's own address), ``honor_labels`` so the exporter's
  pod/namespace labels (the GPU's consumer) are kept as a real DCGM setup keeps them.

Both copy namespace, pod, node, experiment and tier from the pod. Only loopback pod
IPs are kept (the sandbox never dials anything else). ``scrape_interval`` is 2 s: the
sandbox measures short load-test windows (tens of seconds), and a 15 s default would
leave a handful of samples per tier.
"""

from __future__ import annotations

from typing import Any

from kneepoint.sandbox.layout import HOST, Ports, StatePaths

SCRAPE_INTERVAL = "2s"
DCGM_PORT = 9400
ENGINE_ROLE = "engine"
TRACE_PORT_NAME = "trace-metrics"  # kneepoint.kube.naming.TRACE_PORT_NAME (this module imports only the stdlib; a test keeps them equal)


def _pod_relabels(port_name: str = "http") -> list[dict[str, Any]]:
    return [
        {"source_labels": ["__meta_kubernetes_pod_label_kneepoint_io_role"], "regex": ENGINE_ROLE, "action": "keep"},
        {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": port_name, "action": "keep"},
        # Network rule: loopback only. A pod without an IP yet has none and is dropped too.
        {"source_labels": ["__meta_kubernetes_pod_ip"], "regex": r"127\..+", "action": "keep"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
        {"source_labels": ["__meta_kubernetes_pod_label_kneepoint_io_experiment"], "target_label": "experiment"},
        {"source_labels": ["__meta_kubernetes_pod_label_kneepoint_io_tier"], "target_label": "tier"},
    ]


def prometheus_config(paths: StatePaths, ports: Ports) -> dict[str, Any]:
    """The whole prometheus.yml as a dict."""
    pki = paths.pki
    tls_admin = {
        "ca_file": str(pki / "ca.crt"),
        "cert_file": str(pki / "admin.crt"),
        "key_file": str(pki / "admin.key"),
    }
    sd = [{"role": "pod", "kubeconfig_file": str(paths.admin_kubeconfig)}]

    def static(job: str, port: int, scheme: str = "http") -> dict[str, Any]:
        entry: dict[str, Any] = {"job_name": job, "static_configs": [{"targets": [f"{HOST}:{port}"]}]}
        if scheme == "https":
            entry["scheme"] = "https"
            entry["tls_config"] = dict(tls_admin)
        return entry

    return {
        "global": {
            "scrape_interval": SCRAPE_INTERVAL,
            "scrape_timeout": SCRAPE_INTERVAL,
            "evaluation_interval": SCRAPE_INTERVAL,
            "external_labels": {"cluster": "kneepoint-sandbox"},
        },
        "scrape_configs": [
            static("prometheus", ports.prometheus),
            static("etcd", ports.etcd_client),
            static("kube-apiserver", ports.apiserver, "https"),
            static("kube-controller-manager", ports.controller_manager, "https"),
            static("kube-scheduler", ports.scheduler, "https"),
            static("kwok", ports.kwok),
            {
                "job_name": "vllm",
                "metrics_path": "/metrics",
                # Prometheus 3 refuses a scrape without a valid Content-Type unless told what to assume.
                "fallback_scrape_protocol": "PrometheusText0.0.4",
                "kubernetes_sd_configs": sd,
                "relabel_configs": _pod_relabels(),
            },
            {
                "job_name": "trace",
                "metrics_path": "/metrics",
                "fallback_scrape_protocol": "PrometheusText0.0.4",
                "kubernetes_sd_configs": sd,
                "relabel_configs": _pod_relabels(TRACE_PORT_NAME),
            },
            {
                "job_name": "dcgm",
                "metrics_path": "/metrics",
                "fallback_scrape_protocol": "PrometheusText0.0.4",
                "honor_labels": True,
                "kubernetes_sd_configs": sd,
                "relabel_configs": _pod_relabels()
                + [
                    {
                        "source_labels": ["__meta_kubernetes_pod_ip"],
                        "regex": "(.+)",
                        "replacement": f"$1:{DCGM_PORT}",
                        "target_label": "__address__",
                    }
                ],
            },
        ],
    }
