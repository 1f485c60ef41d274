"""``kneepoint export NAME_OR_FILE --kserve``: the KServe InferenceService for the decision, as YAML.

From the cluster, the operator has already published the InferenceService in the
ConfigMap named in ``status.recommendation``: that text is printed as it is, so what
you apply is what the operator recorded. Without one (the operator has not published
yet, or the input is a file) it is built here with the same builder
(``kneepoint.kube.manifests.build_inference_service``) and the same YAML dump as the
operator's, from ``status.decision`` or, for a file that has none, from the decision
re-computed from its tiers.

Exit codes: 0 printed; 1 not decided yet; 2 bad input (one line naming the file or field,
or ``experiment NS/NAME not found``).
"""

from __future__ import annotations

import os
import sys
import typing

import click
import yaml

from kneepoint.commands import experiment_source
from kneepoint.commands.experiment_source import SOURCE_CLUSTER, ClusterSource, InputError, LoadedExperiment, NotFoundError
from kneepoint.core.decision import STATE_DECIDED, decide
from kneepoint.core.status import Decision
from kneepoint.kube.manifests import Owner, build_inference_service

CONFIG_MAP_KEY = "inferenceservice.yaml"
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


def inference_service_yaml(exp: LoadedExperiment, decision: Decision) -> str:
    """The InferenceService as the operator would publish it (same builder, same dump)."""
    if not exp.spec_given:
        raise InputError(f"{exp.where}: spec: missing; the InferenceService needs the experiment's spec (model, engine, capacity)")
    fallback_name = os.path.splitext(os.path.basename(exp.where))[0] if exp.source != SOURCE_CLUSTER else "experiment"
    owner = Owner(exp.name or fallback_name, exp.namespace or "default", exp.uid or "")
    return yaml.safe_dump(build_inference_service(exp.spec, owner, decision), sort_keys=False)


def published_yaml(cluster: ClusterSource, exp: LoadedExperiment) -> str | None:
    """The InferenceService text from the ConfigMap in status.recommendation, or None (with a note) when absent."""
    recommendation = experiment_source.status_recommendation(exp)
    if recommendation is None:
        return None
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
@click.option("--kserve", is_flag=True, help="Print the KServe InferenceService (v1beta1) for the decided tier.")
@click.option("--namespace", "-n", default=None, help="Namespace of the experiment (default: the kube context's, then default).")
@click.option("--kubeconfig", default=None, metavar="PATH", help="Kubeconfig file (default: KUBECONFIG or ~/.kube/config).")
def command(name_or_file: str | None, kserve: bool, namespace: str | None, kubeconfig: str | None) -> None:
    """Print what to deploy for an experiment's decision.

    NAME_OR_FILE: the name of a ParallelismExperiment on the cluster, or a saved one
    (YAML/JSON; '-' reads stdin). Exit code 1 while the experiment is not decided yet.
    """
    if not kserve:
        _fail("--kserve: required; it is the one export format (KServe InferenceService YAML)")
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
        text = published_yaml(cluster, exp) if cluster is not None else None
        if text is None:
            text = inference_service_yaml(exp, decision)
    except NotDecided as err:
        _fail(f"not decided yet: {err}", code=1)
    except InputError as err:
        _fail(str(err))
    click.echo(text, nl=not text.endswith("\n"))
