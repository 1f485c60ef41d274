"""``kneepoint export NAME_OR_FILE --kserve|--lws``: the KServe InferenceService (or the LeaderWorkerSet) for the decision.

From the cluster, the operator has already published the InferenceService in the
ConfigMap named in ``status.recommendation``: that text is printed as it is, so what
you apply is what the operator recorded. Without one (the operator has not published
yet, the input is a file, or ``--deployment-mode``/``--prometheus-url`` ask for another
one) it is built here with the same builder (``kneepoint.kube.kserve``) and the same YAML
dump as the operator's, from ``status.decision`` or, for a file that has none, from the
decision re-computed from its tiers.

Exit codes: 0 printed; 1 not decided yet; 2 bad input (one line naming the file or field,
or ``experiment NS/NAME not found``); 3 the decided tier cannot be an InferenceService
(KServe's multi-node rules; the line says why and ``--lws`` prints the LeaderWorkerSet).
"""

from __future__ import annotations

import os
import sys
import typing

import click
import yaml

from kneepoint.commands import experiment_source
from kneepoint.commands.experiment_source import SOURCE_CLUSTER, ClusterSource, InputError, LoadedExperiment, NotFoundError
from kneepoint.core.architectures import ModelArchitecture, architecture_from_spec
from kneepoint.core.decision import STATE_DECIDED, decide
from kneepoint.core.spec import KSERVE_DEPLOYMENT_MODES
from kneepoint.core.status import Decision
from kneepoint.core.tiers import Tier
from kneepoint.kube import kserve
from kneepoint.kube.manifests import BuildContext, Owner, build_engine_leader_worker_set
from kneepoint.settings import OperatorSettings

CONFIG_MAP_KEY = kserve.CONFIG_MAP_ISVC_KEY
EXIT_NOT_EXPORTABLE = 3
DECIDED = "Decided"


class NotDecided(Exception):
    """The experiment has no decision yet (exit code 1)."""


def decision_for_export(exp: LoadedExperiment) -> Decision:
    """The experiment's decision: status.decision once Decided; for a file without one, re-computed from its tiers."""
    if exp.phase is not None and exp.phase != DECIDED:
        message = exp.status.get("message")
        raise NotDecided(f"{exp.where} is in phase {exp.phase}" + (f" ({' '.join(str(message).split())})" if message else ""))
    stored = experiment_source.status_decision(exp)
    if stored is not None:
        return stored
    if exp.source == SOURCE_CLUSTER:
        raise NotDecided(f"{exp.where} has no status.decision yet")
    try:
        outcome = decide(exp.spec, exp.tiers)
    except ValueError as err:
        raise InputError(f"{exp.where}: status.tiers: {err}") from None
    if outcome.state != STATE_DECIDED or outcome.decision is None:
        raise NotDecided(f"{exp.where}: {outcome.message}")
    return outcome.decision


def _architecture(exp: LoadedExperiment, cluster: ClusterSource | None) -> ModelArchitecture:
    """The model's shape, for sizing the container (the same resolution as the operator's)."""
    ref = exp.spec.model.architecture.config_map_ref
    config = None
    if ref is not None:
        if cluster is None:
            raise InputError(
                f"{exp.where}: spec.model.architecture.configMapRef: the ConfigMap {ref.name!r} is on the cluster; "
                "export the experiment by name from the cluster, or give a preset"
            )
        try:
            config = cluster.get_config_map_data(ref.name).get(ref.key)
        except NotFoundError as err:
            raise InputError(f"spec.model.architecture.configMapRef: {err}") from None
    try:
        return architecture_from_spec(exp.spec.model.architecture, config, model_name=exp.spec.model.uri)
    except ValueError as err:
        raise InputError(f"{exp.where}: {err}") from None


def _owner(exp: LoadedExperiment) -> Owner:
    fallback_name = os.path.splitext(os.path.basename(exp.where))[0] if exp.source != SOURCE_CLUSTER else "experiment"
    return Owner(exp.name or fallback_name, exp.namespace or "default", exp.uid or "")


def _require_spec(exp: LoadedExperiment) -> None:
    if not exp.spec_given:
        raise InputError(f"{exp.where}: spec: missing; the export needs the experiment's spec (model, engine, capacity)")


def inference_service_yaml(
    exp: LoadedExperiment,
    decision: Decision,
    cluster: ClusterSource | None = None,
    deployment_mode: str | None = None,
    prometheus_url: str | None = None,
) -> str:
    """The InferenceService as the operator would publish it (same builder, same dump); raises NotExportable."""
    _require_spec(exp)
    kserve.check_exportable(exp.spec, decision, deployment_mode)
    isvc = kserve.build_inference_service(
        exp.spec,
        _owner(exp).name,
        exp.namespace or "default",
        decision,
        kserve.checkpoint_bytes(exp.spec, _architecture(exp, cluster)),
        deployment_mode=deployment_mode,
        prometheus_url=prometheus_url or OperatorSettings.prometheus_url,
    )
    return yaml.safe_dump(isvc, sort_keys=False)


def leader_worker_set_yaml(exp: LoadedExperiment, decision: Decision) -> str:
    """The decided tier as a LeaderWorkerSet (the operator's own multi-node engine, replicas from the decision)."""
    _require_spec(exp)
    if exp.spec.mode != "Measure":
        raise InputError(f"{exp.where}: spec.mode: a LeaderWorkerSet runs vLLM, so it is built for mode Measure only")
    tier = Tier(decision.tensor_parallel, decision.pipeline_parallel)
    ctx = BuildContext(gpu_product=exp.spec.placement.gpu_product)
    lws = build_engine_leader_worker_set(exp.spec, _owner(exp), tier, ctx, exp.spec.placement.multi_node_topology_key)
    lws["spec"]["replicas"] = max(1, decision.replicas)
    return yaml.safe_dump(lws, sort_keys=False)


def published_yaml(cluster: ClusterSource, exp: LoadedExperiment) -> str | None:
    """The InferenceService text from the ConfigMap in status.recommendation, or None (with a note) when absent."""
    recommendation = experiment_source.status_recommendation(exp)
    if recommendation is None:
        return None
    if recommendation.not_exportable:
        raise kserve.NotExportable(recommendation.not_exportable)
    try:
        data = cluster.get_config_map_data(recommendation.config_map_name)
    except NotFoundError as err:
        click.echo(f"kneepoint export: note: {err}; building the InferenceService from status.decision", err=True)
        return None
    text = data.get(CONFIG_MAP_KEY)
    if not text:
        click.echo(
            f"kneepoint export: note: ConfigMap {cluster.namespace}/{recommendation.config_map_name} has no {CONFIG_MAP_KEY}; "
            "building the InferenceService from status.decision",
            err=True,
        )
        return None
    return text


def _fail(message: str, code: int = 2) -> typing.NoReturn:
    click.echo(f"kneepoint export: error: {' '.join(message.split())}", err=True)
    sys.exit(code)


@click.command(name="export", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("name_or_file", required=False)
@click.option("--kserve", "as_kserve", is_flag=True, help="Print the KServe InferenceService (v1beta1) for the decided tier.")
@click.option(
    "--lws", "as_lws", is_flag=True, help="Print the decided tier as a LeaderWorkerSet (the multi-node engine the operator measured)."
)
@click.option(
    "--deployment-mode",
    type=click.Choice(KSERVE_DEPLOYMENT_MODES),
    default=None,
    help="KServe deployment mode (default: spec.export.kserve.deploymentMode, Standard). RawDeployment and Serverless are "
    "the names KServe <= 0.15 uses.",
)
@click.option(
    "--prometheus-url",
    default=None,
    metavar="URL",
    help="Prometheus KEDA queries in Standard mode (default: the spec's, then the operator's default).",
)
@click.option("--namespace", "-n", default=None, help="Namespace of the experiment (default: the kube context's, then default).")
@click.option("--kubeconfig", default=None, metavar="PATH", help="Kubeconfig file (default: KUBECONFIG or ~/.kube/config).")
def command(
    name_or_file: str | None,
    as_kserve: bool,
    as_lws: bool,
    deployment_mode: str | None,
    prometheus_url: str | None,
    namespace: str | None,
    kubeconfig: str | None,
) -> None:
    """Print what to deploy for an experiment's decision.

    NAME_OR_FILE: the name of a ParallelismExperiment on the cluster, or a saved one
    (YAML/JSON; '-' reads stdin). Exit code 1 while the experiment is not decided yet, 3 when
    the decided tier cannot be an InferenceService (the message says why; --lws prints the
    LeaderWorkerSet instead).
    """
    if as_kserve == as_lws:
        _fail("--kserve or --lws: give exactly one (KServe InferenceService YAML, or the LeaderWorkerSet)")
    if not name_or_file:
        _fail("NAME_OR_FILE: missing; expected an experiment name on the cluster or a saved experiment file")
    try:
        if experiment_source.looks_like_file(name_or_file):
            exp = experiment_source.read_file(name_or_file, require_tiers=False)
            cluster = None
        else:
            cluster = experiment_source.open_cluster(kubeconfig, namespace)
            exp = experiment_source.load_from_cluster(cluster, name_or_file, require_tiers=False)
        decision = decision_for_export(exp)
        if as_lws:
            text = leader_worker_set_yaml(exp, decision)
        else:
            # A mode or Prometheus chosen here differs from what the operator published: build it.
            fresh = deployment_mode is not None or prometheus_url is not None
            published = published_yaml(cluster, exp) if cluster is not None and not fresh else None
            text = published if published is not None else inference_service_yaml(exp, decision, cluster, deployment_mode, prometheus_url)
    except NotDecided as err:
        _fail(f"not decided yet: {err}", code=1)
    except kserve.NotExportable as err:
        _fail(str(err), code=EXIT_NOT_EXPORTABLE)
    except InputError as err:
        _fail(str(err))
    click.echo(text, nl=not text.endswith("\n"))
