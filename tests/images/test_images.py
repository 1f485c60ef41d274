"""The images, built and run: docker/images.py (`make images`).

Two kinds of tests:

- always (no container tools needed, milliseconds): the pure parts of docker/images.py
  (apt's sources, the OCI config each check runs with) and the facts it copies from the
  objects the cluster runs: which pods mount what writable, the non-root user, the chart's
  default image reference;
- ``test_make_images_builds_and_the_in_image_checks_pass``: the whole of ``make images``
  (debootstrap base, buildah builds, the checks under runc). A first run takes minutes
  (measured in docs/install.md) and needs root, buildah, debootstrap and runc; it runs
  only with KNEEPOINT_IMAGES=1 so `make test` stays as fast as it was, and skips with the
  reason otherwise. ``make images`` is the same run with its output on the terminal.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from kneepoint.core.spec import parse_spec
from kneepoint.core.tiers import Tier
from kneepoint.kube import manifests
from kneepoint.settings import OperatorSettings

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kneepoint_images", ROOT / "docker" / "images.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


images = _load()


# --------------------------------------------------------------------------- apt's sources

DEB822 = """\
Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""


def _etc(tmp_path: Path, files: dict[str, str]) -> Path:
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    for name, text in files.items():
        (etc / name).write_text(text)
    return etc


def test_mirror_is_the_deb822_entry_for_the_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KNEEPOINT_DEBIAN_MIRROR", raising=False)
    etc = _etc(tmp_path, {"sources.list.d/debian.sources": DEB822, "sources.list.d/other.list.disabled-by-x": "deb http://x/ y main"})
    assert images.debian_mirror("bookworm", etc) == "http://mirror.example/debian"


def test_mirror_from_one_line_sources_skips_security_and_other_components(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KNEEPOINT_DEBIAN_MIRROR", raising=False)
    text = (
        "# deb http://commented.example/debian bookworm main\n"
        "deb http://security.example/debian-security bookworm-security main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://nodesource.example/node_20.x nodistro contrib\n"
        "deb [arch=amd64] http://mirror.example/debian trixie main contrib\n"
    )
    etc = _etc(tmp_path, {"sources.list": text})
    # No bookworm entry: the host's Debian archive (another release) serves bookworm too.
    assert images.debian_mirror("bookworm", etc) == "http://mirror.example/debian"


def test_mirror_override_and_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    etc = _etc(tmp_path, {"sources.list": "deb http://security.example/ bookworm-security main\n"})
    monkeypatch.delenv("KNEEPOINT_DEBIAN_MIRROR", raising=False)
    with pytest.raises(images.Missing, match="KNEEPOINT_DEBIAN_MIRROR"):
        images.debian_mirror("bookworm", etc)
    monkeypatch.setenv("KNEEPOINT_DEBIAN_MIRROR", "http://own.example/debian")
    assert images.debian_mirror("bookworm", etc) == "http://own.example/debian"


# --------------------------------------------------------------------------- the runtime config

TEMPLATE = {
    "process": {
        "terminal": True,
        "user": {"uid": 0, "gid": 0},
        "args": ["sh"],
        "env": ["PATH=/bin"],
        "cwd": "/",
        "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
        "capabilities": {"bounding": ["CAP_KILL"], "effective": ["CAP_KILL"], "permitted": ["CAP_KILL"], "ambient": ["CAP_KILL"]},
    },
    "root": {"path": "rootfs", "readonly": True},
    "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["ro"]},
    ],
    "linux": {
        "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount", "cgroup")],
        "resources": {"devices": [{"allow": False, "access": "rwm"}]},
    },
}
IMAGE_CONFIG = {
    "User": "65532:65532",
    "Env": ["PATH=/opt/kneepoint/bin:/usr/bin", "PYTHONUNBUFFERED=1"],
    "Entrypoint": ["kneepoint"],
    "WorkingDir": "/tmp",
}


def test_oci_config_runs_as_the_pod_does(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    config = images.oci_config(TEMPLATE, "/merged", IMAGE_CONFIG, ["kneepoint", "loadgen"], images.WORKLOADS["loadtest"], log)
    assert config["root"] == {"path": "/merged", "readonly": True}
    process = config["process"]
    assert process["user"] == {"uid": 65532, "gid": 65532}
    assert process["args"] == ["kneepoint", "loadgen"] and process["cwd"] == "/tmp" and process["terminal"] is False
    assert process["env"] == [*IMAGE_CONFIG["Env"], "HOME=/"]
    assert process["noNewPrivileges"] is True
    assert all(caps == [] for caps in process["capabilities"].values())
    assert {n["type"] for n in config["linux"]["namespaces"]} == {"pid", "ipc", "uts", "mount"}  # host network
    writable = {m["destination"] for m in config["mounts"] if m["type"] in ("tmpfs", "bind") and "ro" not in m.get("options", [])}
    assert writable == {"/dev/shm", "/dev/termination-log"}
    assert TEMPLATE["process"]["user"] == {"uid": 0, "gid": 0}, "the template is not changed"


def test_oci_config_gives_the_operator_its_tmp_and_the_engine_only_its_profiles_dir() -> None:
    operator = images.oci_config(TEMPLATE, "/m", IMAGE_CONFIG, ["kneepoint", "operator"], images.WORKLOADS["operator"], None)
    (tmp,) = [m for m in operator["mounts"] if m["destination"] == "/tmp"]
    assert tmp["type"] == "tmpfs" and "size=64m" in tmp["options"]
    engine = images.oci_config(TEMPLATE, "/m", IMAGE_CONFIG, ["kneepoint", "sim"], images.WORKLOADS["engine"], None)
    assert [m["destination"] for m in engine["mounts"] if m["type"] in ("tmpfs", "bind")] == ["/dev/shm", "/var/run/kneepoint/profiles"]


@pytest.mark.parametrize("user", ["", "nobody", "kneepoint:65532", "0:abc"])
def test_a_user_by_name_is_refused(user: str) -> None:
    with pytest.raises(images.Failed, match="numeric"):
        images.parse_user(user)


# --------------------------------------------------------------------------- facts copied from the cluster's objects


def _spec():  # type: ignore[no-untyped-def]
    return parse_spec(
        {
            "mode": "Simulate",
            "model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct", "architecture": {"preset": "llama-3-8b"}},
            "load": {"concurrency": 4},
        }
    )


OWNER = manifests.Owner("llama8b", "team-a", "uid-1")
CTX = manifests.BuildContext(operator_image="ghcr.io/kneepoint/kneepoint:0.1.0", architecture_json="llama-3-8b")


def _writable(container: dict, pod: dict) -> set[str]:  # type: ignore[type-arg]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    return {
        m["mountPath"]
        for m in container.get("volumeMounts", [])
        if not m.get("readOnly") and "persistentVolumeClaim" not in volumes[m["name"]]
    }


def _restricted(container: dict) -> None:  # type: ignore[type-arg]
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["runAsUser"] == 65532


def test_engine_workload_is_the_simulate_mode_engine_pod() -> None:
    pod = manifests.build_engine_deployment(_spec(), OWNER, Tier(1, 1), CTX)["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == manifests.ENGINE_CONTAINER]
    assert container["command"] == ["kneepoint", "sim"]
    _restricted(container)
    # /dev/shm is a Memory emptyDir in the pod; every runtime mounts one there anyway.
    workload = images.WORKLOADS["engine"]
    assert _writable(container, pod) == {"/dev/shm", *workload.dirs} == {"/dev/shm", manifests.PROFILES_DIR}
    assert workload.tmp_mib is None and not workload.termination_log
    # The trace sidecar runs the same image under the same restrictions and writes nothing but what it reads.
    (sidecar,) = [c for c in pod["containers"] if c["name"] != manifests.ENGINE_CONTAINER]
    assert sidecar["command"] == ["kneepoint", "trace"]
    _restricted(sidecar)
    assert _writable(sidecar, pod) == {manifests.PROFILES_DIR}


def test_loadtest_workload_is_the_load_test_job_pod() -> None:
    job = manifests.build_load_test_job(_spec(), OWNER, Tier(1, 1), 1, CTX)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["kneepoint", "loadgen"]
    _restricted(container)
    assert _writable(container, pod) == set()
    assert container["terminationMessagePath"] == "/dev/termination-log"
    workload = images.WORKLOADS["loadtest"]
    assert workload.tmp_mib is None and workload.termination_log


def test_operator_workload_is_the_charts_deployment(helm: Path, tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "contract"))
    try:
        from chart_render import render
    finally:
        sys.path.pop(0)
    (deployment,) = [d for d in render(helm, tmp_path=tmp_path) if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsUser"] == 65532 and pod["securityContext"]["runAsGroup"] == 65532
    assert images.NON_ROOT == "65532:65532"
    assert _writable(container, pod) == {"/tmp"}
    (tmp,) = [v for v in pod["volumes"] if v["name"] == "tmp"]
    assert images.WORKLOADS["operator"].tmp_mib == 64 and tmp["emptyDir"]["sizeLimit"] == "64Mi"
    # The chart's default image reference is what `make images` tags.
    repository, tag = images.chart_reference()
    assert container["image"] == f"{repository}:{tag}" == "ghcr.io/kneepoint/kneepoint:0.1.0"
    assert images.images()[0].repository == repository


def test_chart_reference_is_values_and_app_version_and_the_monitors_match_it() -> None:
    values = yaml.safe_load((ROOT / "charts" / "kneepoint" / "values.yaml").read_text())
    chart = yaml.safe_load((ROOT / "charts" / "kneepoint" / "Chart.yaml").read_text())
    assert images.chart_reference() == (values["image"]["repository"], chart["appVersion"])
    assert chart["appVersion"] == images.project_version()
    # The engine PodMonitor keeps pods whose image is kneepoint's (not the loadgen image).
    monitoring = (ROOT / "charts" / "kneepoint" / "templates" / "monitoring.yaml").read_text()
    regex = re.search(r"regex: (\(\.\+/\)\?kneepoint\S*)", monitoring)
    assert regex is not None
    repository, tag = images.chart_reference()
    assert re.fullmatch(regex.group(1), f"{repository}:{tag}")
    assert not re.fullmatch(regex.group(1), f"{repository}-loadgen:{tag}")
    # The operator's own default for its Jobs and engines (KNEEPOINT_IMAGE unset) is it too.
    assert OperatorSettings().operator_image == manifests.BuildContext().operator_image == f"{repository}:{tag}"


def test_every_dockerfile_is_built() -> None:
    assert sorted(i.dockerfile for i in images.images()) == sorted(p.name for p in ROOT.glob("Dockerfile*"))


# --------------------------------------------------------------------------- the real thing


def _why_not() -> str | None:
    missing = [tool for tool in images.TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (make images installs them with apt-get as root)"
    if os.geteuid() != 0:
        return "not root (debootstrap, and buildah/runc here, need root)"
    if os.environ.get("KNEEPOINT_IMAGES") != "1":
        return "building the images takes minutes on a fresh machine (docs/install.md): run make images, or set KNEEPOINT_IMAGES=1"
    return None


@pytest.mark.slow
@pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")
def test_make_images_builds_and_the_in_image_checks_pass() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "docker" / "images.py"), "--no-sizes"], capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-8000:]
    summary = json.loads((images.CACHE / "last-run.json").read_text())
    checks = summary["checks"]
    assert len(checks) == 9 and all(c["passed"] for c in checks), checks
    names = " ".join(c["name"] for c in checks)
    for wanted in ("--version", "operator --help", "loadgen against kneepoint sim", "requirements/runtime.txt exactly"):
        assert wanted in names
