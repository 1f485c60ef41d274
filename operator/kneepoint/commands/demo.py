"""``kneepoint demo``: the README's first command, the whole loop on the embedded sandbox.

It brings up the sandbox (building the control plane on first use), installs the operator
with its Helm chart (so it runs as a pod with the chart's ServiceAccount and RBAC, like in a
real cluster), applies an example experiment, follows it tier by tier until it is decided,
and prints the record table, the decision and where the knee chart was written, plus the
kubectl commands to look at it yourself.

When it ends (decided, failed or interrupted) it removes what it started, so that the
README's other command, ``make test``, finds no operator of the demo's still driving
experiments in every namespace: the whole sandbox when the demo started it, else the
experiment, its namespace and the Helm release it installed. ``--keep`` leaves everything
running to look at (``kneepoint sandbox down`` stops it later).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import yaml

DEMO_NAMESPACE = "kneepoint-demo"
OPERATOR_NAMESPACE = "kneepoint-system"
RELEASE = "kneepoint"
LEASE_RELEASE_SECONDS = 45.0
"""Bound on the wait for an uninstalled operator to release its Lease (its pods' 30 s grace period, and some)."""


def _say(line: str) -> None:
    click.echo(line, err=False)


def _run(argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise click.ClickException(f"{what} failed: {(proc.stderr or proc.stdout).strip()}")
    return proc


@click.command("demo")
@click.option(
    "--experiment",
    "experiment_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="ParallelismExperiment to run (default: deploy/examples/experiment.yaml).",
)
@click.option("--namespace", "-n", default=DEMO_NAMESPACE, show_default=True, help="Namespace for the experiment.")
@click.option(
    "--png",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("kneepoint-demo-knee.png"),
    show_default=True,
    help="Where to write the knee chart.",
)
@click.option("--timeout", type=float, default=900.0, show_default=True, help="Give up after this many seconds.")
@click.option(
    "--keep",
    is_flag=True,
    default=False,
    help="Leave the sandbox, the operator and the experiment running when the demo ends (default: remove what it started).",
)
def command(experiment_path: Path | None, namespace: str, png: Path, timeout: float, keep: bool) -> None:
    """Run an example experiment end to end on the local sandbox and print the decision."""
    from kneepoint.sandbox import binaries, controlplane
    from kneepoint.sandbox.helm_binary import ensure_helm

    root = controlplane.repo_root()
    if root is None:
        raise click.ClickException("kneepoint demo needs the source checkout (charts/ and deploy/); run it from a clone")
    experiment_path = experiment_path or root / "deploy" / "examples" / "experiment.yaml"
    doc = yaml.safe_load(experiment_path.read_text())
    name = doc["metadata"]["name"]
    started = time.monotonic()

    _say("== 1/4 sandbox: a real Kubernetes control plane with simulated GPU nodes")
    try:
        sandbox = controlplane.up(say=_say)
    except controlplane.SandboxError as exc:
        raise click.ClickException(str(exc)) from exc
    found = binaries.find_all()
    assert found is not None
    kubectl = [str(found.kubectl), f"--kubeconfig={sandbox.kubeconfig}"]
    cleanup = _Cleanup(sandbox, kubectl, namespace, name)
    try:
        code = _demo(root, sandbox, found, kubectl, experiment_path, namespace, name, png, timeout, started, cleanup, ensure_helm, keep)
    finally:
        if keep:
            _say(f"kept running (--keep): the sandbox, the operator and {namespace}/{name}; stop it all with: kneepoint sandbox down")
        else:
            cleanup.run()
    if code:
        sys.exit(code)


class _Cleanup:
    """What the demo started, removed when it ends (see the module docstring)."""

    def __init__(self, sandbox: Any, kubectl: list[str], namespace: str, name: str):
        self.sandbox = sandbox
        self.kubectl = kubectl
        self.namespace = namespace
        self.name = name
        self.helm: list[str] | None = None
        self.release_installed = False
        self.namespace_created = False

    def run(self) -> None:
        from kneepoint.sandbox import controlplane

        started = list(self.sandbox.started)
        if "kube-apiserver" in started:
            _say("cleaning up: stopping the sandbox the demo started (keep it next time with: kneepoint demo --keep)")
            controlplane.down(say=lambda line: None)
            return
        _say("cleaning up what the demo started (keep it next time with: kneepoint demo --keep)")
        # The experiment first, while the operator runs to remove its finalizer.
        subprocess.run(
            [*self.kubectl, "-n", self.namespace, "delete", "pexp", self.name, "--ignore-not-found", "--wait=true", "--timeout=60s"],
            capture_output=True,
            text=True,
        )
        if self.namespace_created:
            subprocess.run([*self.kubectl, "delete", "namespace", self.namespace, "--wait=false"], capture_output=True, text=True)
        if self.release_installed and self.helm is not None:
            subprocess.run(
                [*self.helm, "uninstall", RELEASE, "--namespace", OPERATOR_NAMESPACE, "--wait", "--timeout", "60s"],
                capture_output=True,
                text=True,
            )
            self._lease_released()
        if started:
            controlplane.down(only=started, say=lambda line: None)

    def _lease_released(self, timeout: float = LEASE_RELEASE_SECONDS) -> None:
        """Wait until the uninstalled operator has let go of its Lease, then delete it.

        The pods are gone from the API before their processes end: the leader releases the Lease
        on SIGTERM a moment later. Until then a test session started next would see an operator
        leading every namespace.
        """
        from kneepoint.kube.leader_election import ElectionTiming, lease_name

        lease = [
            *self.kubectl,
            "-n",
            OPERATOR_NAMESPACE,
            "get",
            "lease",
            lease_name(()),
            "-o",
            "jsonpath={.spec.holderIdentity}|{.spec.renewTime}",
        ]
        deadline = time.monotonic() + timeout
        last, changed = None, time.monotonic()
        while time.monotonic() < deadline:
            proc = subprocess.run(lease, capture_output=True, text=True)
            record = proc.stdout.strip()
            if proc.returncode != 0 or not record.split("|")[0]:  # gone, or released
                break
            if record != last:
                last, changed = record, time.monotonic()
            elif time.monotonic() - changed > ElectionTiming().lease_duration:
                break  # not renewed for a lease duration: its holder is gone (killed without releasing)
            time.sleep(1.0)
        else:
            click.echo(f"warning: the operator's Lease {OPERATOR_NAMESPACE}/{lease_name(())} is still held after {timeout:.0f} s", err=True)
            return
        subprocess.run(
            [*self.kubectl, "-n", OPERATOR_NAMESPACE, "delete", "lease", lease_name(()), "--ignore-not-found"],
            capture_output=True,
            text=True,
        )


def _demo(
    root: Path,
    sandbox: Any,
    found: Any,
    kubectl: list[str],
    experiment_path: Path,
    namespace: str,
    name: str,
    png: Path,
    timeout: float,
    started: float,
    cleanup: _Cleanup,
    ensure_helm: Any,
    keep: bool,
) -> int:
    _say("== 2/4 operator: helm install of charts/kneepoint (runs as a pod with the chart's ServiceAccount)")
    helm = ensure_helm(say=_say)
    cleanup.helm = [str(helm), f"--kubeconfig={sandbox.kubeconfig}"]
    had_release = (
        subprocess.run([*cleanup.helm, "status", RELEASE, "--namespace", OPERATOR_NAMESPACE], capture_output=True, text=True).returncode
        == 0
    )
    cleanup.release_installed = not had_release
    _run(
        [
            str(helm),
            "upgrade",
            "--install",
            RELEASE,
            str(root / "charts" / "kneepoint"),
            f"--kubeconfig={sandbox.kubeconfig}",
            "--namespace",
            OPERATOR_NAMESPACE,
            "--create-namespace",
            "--set",
            f"prometheus.url={sandbox.prometheus_url}",
            "--set",
            "prometheus.scrapeIntervalSeconds=2",
            # The sandbox's Prometheus scrapes every 2 s, so the ladder need not wait long for the last scrape.
            "--set",
            "extraEnv[0].name=KNEEPOINT_METRICS_SETTLE_SECONDS",
            "--set-string",
            "extraEnv[0].value=5",
            "--set",
            "extraEnv[1].name=KNEEPOINT_POLL_SECONDS",
            "--set-string",
            "extraEnv[1].value=2",
            "--wait",
            "--timeout",
            "120s",
        ],
        "helm upgrade --install",
    )
    _say(f"   operator running in namespace {OPERATOR_NAMESPACE}")

    _say(f"== 3/4 experiment: {experiment_path.name} -> {namespace}/{name}")
    cleanup.namespace_created = subprocess.run([*kubectl, "create", "namespace", namespace], capture_output=True, text=True).returncode == 0
    existing = subprocess.run([*kubectl, "-n", namespace, "get", "pexp", name], capture_output=True, text=True)
    if existing.returncode == 0:
        # A fresh run each time: the demo is about watching the ladder, not a cached answer.
        _run([*kubectl, "-n", namespace, "delete", "pexp", name, "--wait=true", "--timeout=120s"], "deleting the previous run")
    _run([*kubectl, "-n", namespace, "apply", "-f", str(experiment_path)], "kubectl apply")
    _say("   follow it yourself in another terminal:")
    _say(f"     export KUBECONFIG={sandbox.kubeconfig}")
    _say(f"     {found.kubectl} get pexp -n {namespace} -w")
    _say(f"     {found.kubectl} get events -n {namespace} --field-selector involvedObject.name={name} -w")

    _say("== 4/4 watching the ladder (each tier: deploy, load test, metrics, stop rules)")
    from kneepoint.commands.experiment_source import LoadedExperiment, load_from_cluster, open_cluster
    from kneepoint.commands.report import watch_experiment

    cluster = open_cluster(str(sandbox.kubeconfig), namespace)
    deadline = time.monotonic() + timeout

    def fetch() -> LoadedExperiment:
        if time.monotonic() > deadline:
            raise click.ClickException(
                f"the experiment did not finish within {timeout:.0f} s; see kubectl describe pexp -n {namespace} {name}"
            )
        return load_from_cluster(cluster, name, require_tiers=False)

    watch_experiment(fetch, echo=_say, warn=lambda line: click.echo(line, err=True), interval=3.0)

    report = subprocess.run(
        [sys.executable, "-m", "kneepoint", "report", name, "-n", namespace, f"--kubeconfig={sandbox.kubeconfig}", "--png", str(png)],
        text=True,
    )
    _say("")
    _say(f"knee chart: {png.resolve()}")
    if keep:
        _say(f"KServe recommendation: kneepoint export {name} -n {namespace} --kserve --kubeconfig {sandbox.kubeconfig}")
    else:
        _say("to look around afterwards (kubectl, kneepoint export --kserve), run it as: kneepoint demo --keep")
    _say(f"demo took {time.monotonic() - started:.0f} s")
    return report.returncode
