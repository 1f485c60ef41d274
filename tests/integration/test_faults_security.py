"""Security: the operator with the chart's ServiceAccount only, a planted hub token, non-root.

The chart is rendered with the pinned helm in namespaced mode (``watchNamespaces: [team]``)
and only its RBAC objects are applied. The operator then runs as a process whose kubeconfig
holds a token of that ServiceAccount (TokenRequest), nothing else:

- the API server denies it Secrets (cluster-wide and in its own namespace) and every write
  outside the watched namespace, as the real requests it would make (not impersonation);
- it still drives a Measure-mode experiment to Decided in the watched namespace, and
  leaves an experiment in another namespace alone;
- a Secret with a recognisable model-hub token, referenced by spec.model.hubTokenSecretRef,
  reaches the engine process (by secretKeyRef) but never status, events, the operator's
  log, the engine's or load generator's log, or the runner's log;
- the chart's operator pod and the operator's load-test Jobs run as non-root with a
  read-only root filesystem, and both images' Dockerfiles end with a non-root USER.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from conftest import OperatorProcess
from experiment_api import Cluster, experiment, tier
from fault_harness import FaultLog
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from kneepoint.core.spec import parse_spec
from kneepoint.core.tiers import Tier
from kneepoint.kube import manifests

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kneepoint"


def render(helm: Path, release: str, namespace: str, values: dict[str, Any], tmp: Path) -> list[dict[str, Any]]:
    values_file = tmp / f"{release}-values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    proc = subprocess.run(
        [str(helm), "template", release, str(CHART), "--namespace", namespace, "--values", str(values_file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@dataclass
class Install:
    release: str
    system: str  # where the ServiceAccount lives
    team: str  # the watched namespace
    other: str  # a namespace it must leave alone
    service_account: str
    kubeconfig: Path
    token: str


@pytest.fixture(scope="module")
def install(sandbox: Any, helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    # Names outside the session operator's prefix: only the ServiceAccount's operator may act here.
    suffix = uuid.uuid4().hex[:6]
    release, system, team, other = f"kpsec-{suffix}", f"kpsec-sys-{suffix}", f"kpsec-team-{suffix}", f"kpsec-other-{suffix}"
    tmp = tmp_path_factory.mktemp("security")
    for ns in (system, team, other):
        sandbox.kubectl("create", "namespace", ns)
    docs = render(helm, release, system, {"watchNamespaces": [team], "metrics": {"port": 0}}, tmp)
    rbac = [d for d in docs if d["kind"] in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")]
    (tmp / "rbac.yaml").write_text(yaml.safe_dump_all(rbac))
    sandbox.kubectl("apply", "--server-side", "--field-manager=kneepoint-security-test", "-f", str(tmp / "rbac.yaml"))
    sa = next(d["metadata"]["name"] for d in rbac if d["kind"] == "ServiceAccount")
    with sandbox.api_client() as api:
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
        token = client.CoreV1Api(api).create_namespaced_service_account_token(sa, system, request).status.token
    admin = yaml.safe_load(sandbox.kubeconfig.read_text())
    cluster_entry = admin["clusters"][0]
    kubeconfig = tmp / "operator.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "sandbox", "cluster": cluster_entry["cluster"]}],
                "users": [{"name": sa, "user": {"token": token}}],
                "contexts": [{"name": sa, "context": {"cluster": "sandbox", "user": sa}}],
                "current-context": sa,
            }
        )
    )
    try:
        yield Install(release, system, team, other, sa, kubeconfig, token)
    finally:
        for ns in (team, other):
            sandbox.kubectl("delete", "parallelismexperiments.kneepoint.io", "--all", "-n", ns, "--timeout=30s", check=False)
        for ns in (team, other, system):
            sandbox.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        sandbox.kubectl("delete", "clusterrole,clusterrolebinding", "-l", f"app.kubernetes.io/instance={release}", check=False)


def _sa_api(install: Install) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(install.kubeconfig))


def _status_code(call: Any) -> int:
    try:
        call()
        return 200
    except ApiException as exc:
        return int(exc.status)


def test_service_account_cannot_read_secrets_or_write_outside_its_namespace(sandbox: Any, install: Install) -> None:
    with _sa_api(install) as api:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        assert _status_code(lambda: core.list_secret_for_all_namespaces()) == 403
        assert _status_code(lambda: core.list_namespaced_secret(install.team)) == 403
        assert _status_code(lambda: core.list_namespaced_secret(install.system)) == 403
        assert _status_code(lambda: core.read_namespaced_secret("anything", install.team)) == 403
        assert _status_code(lambda: apps.list_namespaced_deployment(install.other)) == 403
        assert _status_code(lambda: core.list_namespaced_config_map(install.other)) == 403
        body = {
            "metadata": {"name": "x"},
            "spec": {
                "selector": {"matchLabels": {"a": "b"}},
                "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
            },
        }
        assert _status_code(lambda: apps.create_namespaced_deployment(install.other, body)) == 403
        assert (
            _status_code(
                lambda: core.create_namespaced_pod(install.team, {"metadata": {"name": "p"}, "spec": body["spec"]["template"]["spec"]})
            )
            == 403
        )
        # What the operator needs, it has.
        assert _status_code(lambda: core.list_node()) == 200
        assert _status_code(lambda: apps.list_namespaced_deployment(install.team)) == 200
    FaultLog().record("security", "ServiceAccount denials (secrets, other namespaces)", True, denied=8, allowed=2)


def _scan(text: str, token: str) -> bool:
    return token in text or base64.b64encode(token.encode()).decode() in text


def test_operator_with_only_its_service_account_runs_an_experiment_and_never_shows_the_hub_token(
    sandbox: Any, install: Install, tmp_path: Path
) -> None:
    token = f"hf_kneepointPLANTED{uuid.uuid4().hex}"
    name, stray = "secured", "not-mine"
    with sandbox.api_client() as admin_api:
        cluster = Cluster(admin_api)
        cluster.core.create_namespaced_secret(install.team, {"metadata": {"name": "hf-token"}, "stringData": {"token": token}})
        # The Lease where the chart's pod keeps it (its Role allows leases there only).
        op = OperatorProcess(
            sandbox,
            tmp_path / "sa-operator",
            kubeconfig=install.kubeconfig,
            extra_env={"KNEEPOINT_NAMESPACES": install.team, "KNEEPOINT_LEASE_NAMESPACE": install.system},
        )
        op.start()
        try:
            cluster.create(experiment(stray, install.other, {"tiers": {"tensorParallel": [1]}}))
            cluster.create(
                experiment(
                    name,
                    install.team,
                    {"tiers": {"tensorParallel": [1]}, "model": {"hubTokenSecretRef": {"name": "hf-token", "key": "token"}}},
                )
            )
            # The engine gets the token by reference: find it in the engine process's environment.
            cluster.wait(
                install.team,
                name,
                lambda s: (tier(s, "tp1-pp1") or {}).get("phase") in ("LoadTesting", "Collecting", "Measured"),
                120,
                "the engine serving",
            )
            engine_env = _engine_environ(install.team)
            final = cluster.wait_finished(install.team, name, 120)
            stray_status = cluster.status(install.other, stray)
            events = cluster.core.list_namespaced_event(install.team).items
            deployment_seen = _deployment_env(cluster, install.team, name)
        finally:
            # While its operator still runs to release kopf's finalizer.
            sandbox.kubectl("delete", "parallelismexperiments.kneepoint.io", "--all", "-n", install.team, "--timeout=30s", check=False)
            op.stop()
    assert final["phase"] == "Decided", final
    assert stray_status == {}, stray_status  # another namespace's experiment: untouched
    assert engine_env.get("HF_TOKEN") == token, "the token did not reach the engine, so the scan below would prove nothing"
    assert deployment_seen == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}

    places = {
        "status": json.dumps(final),
        "events": "\n".join(f"{e.reason} {e.message}" for e in events),
        "operator log": op.logs(),
        "runner log": sandbox.sandbox.paths.log("runner").read_text(errors="replace"),
        "pod logs": "\n".join(p.read_text(errors="replace") for p in (sandbox.sandbox.paths.root / "pods").glob(f"{install.team}_*")),
    }
    assert places["operator log"] and places["pod logs"], "nothing to scan"
    leaked = [where for where, text in places.items() if _scan(text, token)]
    assert leaked == [], f"the hub token appears in: {leaked}"
    assert not re.search(r"Forbidden|forbidden", op.logs()), op.logs()[-2000:]  # it never needed more
    FaultLog().record(
        "security",
        "planted hub token: scanned status, events, operator/runner/pod logs",
        True,
        places_scanned=len(places),
        leaks=len(leaked),
    )


def _engine_environ(namespace: str) -> dict[str, str]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if " sim " not in " ".join(proc.info["cmdline"] or []) + " ":
                    continue
                env = proc.environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if env.get("POD_NAMESPACE") == namespace:
                return env
        time.sleep(0.3)
    return {}


def _deployment_env(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    """The HF_TOKEN entry of the engine the operator builds (the live one is gone once Decided)."""
    spec = parse_spec(cluster.get(namespace, name)["spec"])
    d = manifests.build_engine_deployment(spec, manifests.Owner(name, namespace, "uid"), Tier(1, 1), manifests.BuildContext())
    return next((e for e in d["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == "HF_TOKEN"), None)


def test_operator_and_load_generator_run_as_non_root(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, "kp", "kneepoint-system", {}, tmp_path)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    for container in pod["containers"]:
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
    spec = parse_spec({"model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct"}})
    job = manifests.build_load_test_job(spec, manifests.Owner("x", "ns", "uid"), Tier(1, 1), 1, manifests.BuildContext())
    for container in job["spec"]["template"]["spec"]["containers"]:
        sc = container["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0 and sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert job["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    for dockerfile in ("Dockerfile", "Dockerfile.loadgen"):
        users = [line.split()[1] for line in (ROOT / dockerfile).read_text().splitlines() if line.startswith("USER ")]
        assert users and users[-1].split(":")[0] not in ("0", "root"), (dockerfile, users)
    FaultLog().record("security", "non-root: chart operator pod, load-test Job, both Dockerfiles", True)
