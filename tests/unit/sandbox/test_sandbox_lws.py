"""LeaderWorkerSet as a sandbox component: its pin, Configuration, ports, webhook URLs and packaged files."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from kneepoint.sandbox import flags, gomod, lws_component, lws_config, pins
from kneepoint.sandbox.layout import Ports, StatePaths

PATHS = StatePaths(Path("/state"))


def test_pin_builds_the_cmd_package_as_lws():
    build = pins.lws_build()
    assert build.binaries == ("lws",) and dict(build.outputs)["lws"] == "sigs.k8s.io/lws/cmd"
    assert "sigs.k8s.io/lws " + pins.LWS_VERSION in gomod.wrapper_gomod(build)
    assert build not in pins.all_builds()  # optional: built by `up --with-lws` only
    assert f"GitVersion={pins.LWS_VERSION}" in build.ldflags


def test_configuration_is_loopback_without_leader_election_or_cert_rotation():
    cfg = lws_config.configuration(PATHS, Ports().shifted(1000))
    assert cfg["kind"] == "Configuration" and cfg["apiVersion"] == "config.lws.x-k8s.io/v1alpha1"
    assert cfg["leaderElection"] == {"leaderElect": False}
    assert cfg["internalCertManagement"] == {"enable": False}
    assert cfg["webhook"] == {"host": "127.0.0.1", "port": 10443, "certDir": "/state/lws-certs"}
    assert cfg["health"] == {"healthProbeBindAddress": "127.0.0.1:9081"}
    assert cfg["metrics"] == {"bindAddress": "0"}


def test_lws_is_an_optional_component_with_its_ports_and_health():
    ports = Ports()
    assert flags.COMPONENTS.index("lws") < flags.COMPONENTS.index("runner")
    assert flags.listen_ports(ports)["lws"] == [9443, 8081]
    assert flags.health(ports)["lws"].url == "http://127.0.0.1:8081/readyz"
    names = ("etcd", "kube_apiserver", "kube_controller_manager", "kube_scheduler", "kwok", "prometheus", "lws")
    argv = flags.commands({n: f"/bin/{n}" for n in names}, "/py", PATHS, ports)["lws"]
    assert argv == ["/bin/lws", "--config=/state/lws-config.yaml", "--kubeconfig=/state/kubeconfig", "--zap-log-level=info"]


def test_webhooks_point_at_loopback_with_the_ca_and_pod_webhooks_keep_their_selector():
    docs = lws_component.webhook_configurations(9443, b"PEM")
    assert [d["kind"] for d in docs] == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    hooks = [h for d in docs for h in d["webhooks"]]
    assert {h["name"] for h in hooks} == {"mleaderworkerset.kb.io", "mpod.kb.io", "vleaderworkerset.kb.io", "vpod.kb.io"}
    for hook in hooks:
        assert hook["clientConfig"]["url"].startswith("https://127.0.0.1:9443/")
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == b"PEM"
        assert "service" not in hook["clientConfig"]
        if "pod" in hook["name"]:
            # Without it the Fail policy would stop every pod of the cluster while LWS is down.
            assert hook["objectSelector"] == {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}
    paths = {h["clientConfig"]["url"].split("9443", 1)[1] for h in hooks}
    assert paths == {
        "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
        "/mutate--v1-pod",
        "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
        "/validate--v1-pod",
    }


def test_packaged_crds_are_the_lws_ones_with_their_schema():
    groups = {}
    for path in lws_component.crd_files():
        crd = json.loads(path.read_text())
        groups[crd["spec"]["group"]] = crd
        assert crd["kind"] == "CustomResourceDefinition"
        assert any(v["served"] and v["storage"] for v in crd["spec"]["versions"])
    lws = groups["leaderworkerset.x-k8s.io"]
    assert lws["spec"]["names"]["plural"] == "leaderworkersets"
    schema = lws["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    template = schema["properties"]["spec"]["properties"]["leaderWorkerTemplate"]["properties"]
    assert template["size"]["default"] == 1 and "workerTemplate" in template
    assert "disaggregatedset.x-k8s.io" in groups


def test_strip_descriptions_keeps_a_property_named_description():
    schema = {"description": "prose", "properties": {"description": {"type": "string", "description": "more"}}}
    assert lws_component._strip_descriptions(schema) == {"properties": {"description": {"type": "string"}}}
