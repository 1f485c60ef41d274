"""What the sandbox's pod runner starts for one container: argv, environment, probes.

Pure (standard library only): every function takes the pod, container and node as the
API's JSON dicts (camelCase) plus what the adapter fetched (ConfigMaps, Secrets), and
returns plain data. The runner stands in for the kubelet and the container runtime, so
the rules here follow the kubelet's where they exist (env order, ``$(VAR)`` expansion,
downward API, error texts) and say so where the sandbox differs.

Which process a container gets (its :class:`ContainerPlan` ``kind``):

- ``engine``: the image names vLLM (``vllm`` in the image reference). The container's vLLM
  command line (``vllm serve MODEL ...``, ``python3 -m vllm.entrypoints.openai.api_server
  ...`` or the image entrypoint with args only) becomes ``python -m kneepoint sim ...``
  with the same flags.
- ``kneepoint``: the command is ``kneepoint ...`` (or ``python -m kneepoint ...``, or the
  kneepoint image's entrypoint with args only): ``python -m kneepoint ...``.
- ``pretend``: anything else (busybox, a controller image): no process; the runner reports
  the container running and ready, as KWOK would, and, in a pod that does not restart
  (Jobs), completed with exit code 0 at once (as KWOK's pod-complete stage does).

A simulator (``engine``, or ``kneepoint sim``) always binds to the pod's own loopback
address (``--host`` is replaced): vLLM's usual ``--host 0.0.0.0`` would break the network
rule and make two pods collide on one port. ``--port`` stays what the command line says
(vLLM's default 8000 when absent), as in a real pod: a port that disagrees with the
container's ``containerPort`` fails the readiness probe there too.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from kneepoint.core import node_labels as keys

ENGINE = "engine"
KNEEPOINT = "kneepoint"
PRETEND = "pretend"

VLLM_DEFAULT_PORT = 8000
DEFAULT_MODEL_LOAD_SECONDS = "2"

# The environment a container image would bring (the kubelet adds none of these; images do).
IMAGE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    # Python images commonly set it; without it a child's log lines reach the log file late.
    "PYTHONUNBUFFERED": "1",
}

_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)?)?$")
_VLLM_API_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")
_SHELLS = ("sh", "bash", "dash", "ash")
# Characters that make a `sh -c` script more than one plain command line.
_SHELL_SYNTAX = set(";&|<>`$()\n*?{}~")


class ContainerConfigError(ValueError):
    """The kubelet's CreateContainerConfigError: env refers to a missing ConfigMap/Secret/key."""


class ContainerCommandError(ValueError):
    """The sandbox cannot turn this container's command into a process (CreateContainerError)."""


@dataclass(frozen=True)
class EnvSources:
    """ConfigMaps and Secrets of the pod's namespace that its env refers to.

    ``None`` for a name means the object does not exist. Secret values are decoded text;
    they reach the child's environment only, never a log line.
    """

    config_maps: Mapping[str, Mapping[str, str] | None] = field(default_factory=dict)
    secrets: Mapping[str, Mapping[str, str] | None] = field(default_factory=dict)


@dataclass(frozen=True)
class ContainerPlan:
    """One container as the runner will run it."""

    name: str
    image: str
    kind: str
    """``engine``, ``kneepoint`` or ``pretend``."""
    argv: tuple[str, ...]
    """Empty for ``pretend``."""
    env: Mapping[str, str]
    listen: tuple[str, int] | None = None
    """(host, port) a simulator serves on; None for other kinds."""


@dataclass(frozen=True)
class ProbeSpec:
    """A readiness or startup probe, with the kubelet's defaults filled in."""

    action: str
    """``http``, ``tcp``, ``exec`` or ``grpc``."""
    host: str = ""
    port: int = 0
    path: str = "/"
    scheme: str = "HTTP"
    headers: tuple[tuple[str, str], ...] = ()
    initial_delay_seconds: float = 0.0
    period_seconds: float = 10.0
    timeout_seconds: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3


# ---------------------------------------------------------------------------------------
# Which process


def classify_container(container: Mapping[str, Any]) -> str:
    """``engine``, ``kneepoint`` or ``pretend`` for one container spec (see the module doc)."""
    image = str(container.get("image") or "")
    if "vllm" in image.lower():
        # A --headless rank of a multi-node replica serves nothing: the group's leader runs
        # the one simulator that models the whole group, the workers only report Ready.
        return PRETEND if is_headless_rank(container) else ENGINE
    if _kneepoint_words(container) is not None:
        return KNEEPOINT
    return PRETEND


def is_headless_rank(container: Mapping[str, Any]) -> bool:
    """Whether a vLLM container is a non-serving rank of a multi-node replica (``--headless``)."""
    words = [str(w) for w in (container.get("command") or [])] + [str(w) for w in (container.get("args") or [])]
    return "--headless" in (_shell_script_words(words) or words)


def multi_node_count(words: Sequence[str]) -> int:
    """vLLM's ``--nnodes`` (1 when absent or not a number): how many nodes the replica spans."""
    try:
        return max(1, int(_flag_value(words, "--nnodes") or 1))
    except ValueError:
        return 1


def _image_repository(image: str) -> str:
    """``ghcr.io/kneepoint/kneepoint:0.1`` -> ``ghcr.io/kneepoint/kneepoint``."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def _is_kneepoint_image(image: str) -> bool:
    return _image_repository(image).rsplit("/", 1)[-1] == "kneepoint"


def _shell_script_words(words: Sequence[str]) -> list[str] | None:
    """The words of ``sh -c 'plain command line'``; None when it is no such thing."""
    if len(words) >= 3 and words[0].rsplit("/", 1)[-1] in _SHELLS and words[1] == "-c":
        script = words[2].strip()
        if script.startswith("exec "):
            script = script[len("exec ") :]
        if _SHELL_SYNTAX & set(script):
            return None
        try:
            return shlex.split(script)
        except ValueError:
            return None
    return None


def _kneepoint_words(container: Mapping[str, Any]) -> list[str] | None:
    """The words after ``kneepoint`` for a container that runs the kneepoint CLI, else None."""
    command = [str(w) for w in container.get("command") or []]
    args = [str(w) for w in container.get("args") or []]
    if not command:
        # The kneepoint image's entrypoint is the CLI: args are its subcommand and flags.
        return args if args and _is_kneepoint_image(str(container.get("image") or "")) else None
    words = command + args
    script = _shell_script_words(words)
    if script is not None:
        words = script
    if not words:
        return None
    head = words[0].rsplit("/", 1)[-1]
    if head == "kneepoint":
        return words[1:]
    if _PYTHON_RE.match(head) and words[1:3] == ["-m", "kneepoint"]:
        return words[3:]
    return None


def vllm_server_args(container: Mapping[str, Any]) -> list[str]:
    """The vLLM server flags of an engine container, launcher stripped, model as ``--model``.

    Understands the image entrypoint (args only), ``vllm serve [MODEL] ...``, ``python3 -m
    vllm.entrypoints.openai.api_server ...`` and either inside ``sh -c '...'`` without
    shell syntax. Raises ContainerCommandError for anything else.
    """
    command = [str(w) for w in container.get("command") or []]
    args = [str(w) for w in container.get("args") or []]
    words = command + args
    if command:
        script = _shell_script_words(words)
        if script is not None:
            words = script
        head = words[0].rsplit("/", 1)[-1] if words else ""
        if head == "vllm" and words[1:2] == ["serve"]:
            words = words[2:]
        elif _PYTHON_RE.match(head) and len(words) >= 3 and words[1] == "-m" and words[2] in _VLLM_API_MODULES:
            words = words[3:]
        else:
            raise ContainerCommandError(
                f"container {container.get('name')!r}: command {shlex.join(command)!r} is not a vLLM server command "
                "(expected `vllm serve`, `python3 -m vllm.entrypoints.openai.api_server` or none)"
            )
    elif words[:1] == ["serve"]:
        # An entrypoint of plain `vllm` with `serve` as the first arg.
        words = words[1:]
    if words and not words[0].startswith("-"):
        # `vllm serve MODEL`: the positional model overrides --model, as in vLLM.
        model = words[0]
        words = ["--model", model, *_without_flag(words[1:], "--model")]
    return words


def _without_flag(words: Sequence[str], flag: str) -> list[str]:
    """``words`` without ``flag VALUE`` and ``flag=VALUE``."""
    out: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if word == flag:
            skip = True
            continue
        if word.startswith(flag + "="):
            continue
        out.append(word)
    return out


def _flag_value(words: Sequence[str], flag: str, *aliases: str) -> str | None:
    """The last value given to ``flag`` or an alias (``flag V`` or ``flag=V``), else None."""
    value = None
    for i, word in enumerate(words):
        for name in (flag, *aliases):
            if word == name and i + 1 < len(words):
                value = words[i + 1]
            elif word.startswith(name + "="):
                value = word[len(name) + 1 :]
    return value


def bind_simulator(words: Sequence[str], pod_ip: str) -> tuple[list[str], int]:
    """Simulator flags with ``--host`` set to the pod's address; also the port it will use.

    ``--port`` keeps the command line's value (vLLM's default 8000 when absent).
    Raises ContainerCommandError for a ``--port`` that is not an integer 1-65535.
    """
    port_text = _flag_value(words, "--port")
    port = VLLM_DEFAULT_PORT
    if port_text is not None:
        try:
            port = int(port_text)
        except ValueError:
            port = 0
        if not 1 <= port <= 65535:
            raise ContainerCommandError(f"--port {port_text!r}: must be an integer 1-65535")
    rest = _without_flag(_without_flag(words, "--host"), "--port")
    return [*rest, "--host", pod_ip, "--port", str(port)], port


def container_argv(container: Mapping[str, Any], python: str, pod_ip: str) -> tuple[str, list[str], tuple[str, int] | None]:
    """(kind, argv, listen address) for one container; argv is empty for ``pretend``."""
    kind = classify_container(container)
    if kind == ENGINE:
        words, port = bind_simulator(vllm_server_args(container), pod_ip)
        return kind, [python, "-m", "kneepoint", "sim", *words], (pod_ip, port)
    if kind == KNEEPOINT:
        words = _kneepoint_words(container) or []
        if words[:1] == ["sim"]:
            flags, port = bind_simulator(words[1:], pod_ip)
            return kind, [python, "-m", "kneepoint", "sim", *flags], (pod_ip, port)
        return kind, [python, "-m", "kneepoint", *words], None
    return kind, [], None


def is_simulator(plan_kind: str, argv: Sequence[str]) -> bool:
    """Whether a planned process is the engine simulator."""
    return plan_kind in (ENGINE, KNEEPOINT) and list(argv[1:4]) == ["-m", "kneepoint", "sim"]


# ---------------------------------------------------------------------------------------
# Environment


def referenced_objects(pod: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """Names of the ConfigMaps and Secrets the env of the pod's containers refers to."""
    config_maps: set[str] = set()
    secrets: set[str] = set()
    for container in _all_containers(pod):
        for source in container.get("envFrom") or []:
            if "configMapRef" in source:
                config_maps.add(source["configMapRef"].get("name", ""))
            if "secretRef" in source:
                secrets.add(source["secretRef"].get("name", ""))
        for var in container.get("env") or []:
            value_from = var.get("valueFrom") or {}
            if "configMapKeyRef" in value_from:
                config_maps.add(value_from["configMapKeyRef"].get("name", ""))
            if "secretKeyRef" in value_from:
                secrets.add(value_from["secretKeyRef"].get("name", ""))
    return config_maps, secrets


def _all_containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def expand_references(text: str, env: Mapping[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion: defined names are replaced, ``$$`` escapes ``$``,
    undefined references stay as written."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                close = text.find(")", i + 2)
                if close != -1:
                    name = text[i + 2 : close]
                    if name in env:
                        out.append(env[name])
                    else:
                        out.append(text[i : close + 1])
                    i = close + 1
                    continue
        out.append(char)
        i += 1
    return "".join(out)


def _field_ref(pod: Mapping[str, Any], path: str, pod_ip: str, host_ip: str) -> str:
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple = {
        "metadata.name": metadata.get("name", ""),
        "metadata.namespace": metadata.get("namespace", ""),
        "metadata.uid": metadata.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
    }
    if path in simple:
        return str(simple[path])
    match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']*)'\]", path)
    if match:
        return str((metadata.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ContainerConfigError(f"unsupported fieldRef fieldPath {path!r}")


_QUANTITY_SUFFIXES: dict[str, int | Fraction] = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip # a table: one unit family per row


def parse_quantity(text: str) -> Fraction:
    """A Kubernetes resource quantity (``500m``, ``1Gi``, ``2``, ``1e3``) as an exact number."""
    text = str(text).strip()
    for suffix in sorted(_QUANTITY_SUFFIXES, key=len, reverse=True):
        if text.endswith(suffix) and text[: -len(suffix)]:
            number, multiplier = text[: -len(suffix)], Fraction(_QUANTITY_SUFFIXES[suffix])
            break
    else:
        number, multiplier = text, Fraction(1)
    try:
        return Fraction(Decimal(number)) * multiplier
    except (InvalidOperation, ValueError):
        raise ValueError(f"quantity {text!r}: not a Kubernetes quantity (e.g. 500m, 2, 1Gi)") from None


def _resource_field_ref(container: Mapping[str, Any], ref: Mapping[str, Any], node: Mapping[str, Any]) -> str:
    """The downward API's resourceFieldRef: the limit (else the node's allocatable) / divisor, rounded up."""
    resource = str(ref.get("resource", ""))
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or not name:
        raise ContainerConfigError(f"unsupported resourceFieldRef resource {resource!r}")
    resources = container.get("resources") or {}
    value = (resources.get(kind) or {}).get(name)
    if value is None and kind == "requests":
        value = (resources.get("limits") or {}).get(name)
    if value is None:
        value = ((node.get("status") or {}).get("allocatable") or {}).get(name, "0")
    divisor = parse_quantity(str(ref.get("divisor") or "1"))
    if divisor == 0:
        raise ContainerConfigError(f"resourceFieldRef {resource!r}: divisor must not be 0")
    return str(math.ceil(parse_quantity(str(value)) / divisor))


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    pod_ip: str,
    host_ip: str,
    node: Mapping[str, Any],
    sources: EnvSources,
    defaults: Mapping[str, str],
) -> dict[str, str]:
    """The container's environment as the kubelet builds it, over ``defaults``.

    Order (later wins): ``defaults`` (image env and the runner's stand-ins), ``envFrom``
    in order, ``env`` in order. ``$(VAR)`` in ``env`` values expands against what came
    before. Raises ContainerConfigError with the kubelet's wording for a missing
    ConfigMap, Secret or key that is not optional.
    """
    namespace = (pod.get("metadata") or {}).get("namespace", "")
    env: dict[str, str] = dict(defaults)
    for source in container.get("envFrom") or []:
        prefix = str(source.get("prefix") or "")
        for ref_key, kind, table in (("configMapRef", "configmaps", sources.config_maps), ("secretRef", "secrets", sources.secrets)):
            if ref_key not in source:
                continue
            ref = source[ref_key] or {}
            name = str(ref.get("name", ""))
            data = table.get(name)
            if data is None:
                if ref.get("optional"):
                    continue
                raise ContainerConfigError(f'{kind} "{name}" not found')
            for key, value in data.items():
                if key and "=" not in key:
                    env[prefix + key] = value
    for var in container.get("env") or []:
        name = str(var.get("name", ""))
        if "value" in var or "valueFrom" not in var:
            env[name] = expand_references(str(var.get("value") or ""), env)
            continue
        value_from = var["valueFrom"] or {}
        if "fieldRef" in value_from:
            env[name] = _field_ref(pod, str(value_from["fieldRef"].get("fieldPath", "")), pod_ip, host_ip)
        elif "resourceFieldRef" in value_from:
            env[name] = _resource_field_ref(container, value_from["resourceFieldRef"], node)
        else:
            for ref_key, kind, label, table in (
                ("configMapKeyRef", "configmaps", "ConfigMap", sources.config_maps),
                ("secretKeyRef", "secrets", "Secret", sources.secrets),
            ):
                if ref_key not in value_from:
                    continue
                ref = value_from[ref_key] or {}
                ref_name, key = str(ref.get("name", "")), str(ref.get("key", ""))
                data = table.get(ref_name)
                if data is None:
                    if ref.get("optional"):
                        break
                    raise ContainerConfigError(f'{kind} "{ref_name}" not found')
                if key not in data:
                    if ref.get("optional"):
                        break
                    raise ContainerConfigError(f"couldn't find key {key} in {label} {namespace}/{ref_name}")
                env[name] = data[key]
                break
            else:
                raise ContainerConfigError(f"env {name!r}: unsupported valueFrom {sorted(value_from)}")
    return env


def gpu_request(container: Mapping[str, Any]) -> int:
    """GPUs the container asks for (extended resources are set as limits)."""
    resources = container.get("resources") or {}
    for kind in ("limits", "requests"):
        value = (resources.get(kind) or {}).get(keys.GPU_RESOURCE)
        if value is not None:
            try:
                return int(parse_quantity(str(value)))
            except ValueError:
                return 0
    return 0


def hardware_env(node_labels: Mapping[str, str], gpus: int) -> dict[str, str]:
    """The simulator's hardware env from the node's labels (CONTRACTS C and D).

    A ``mixed`` node gives ``nvlink`` when the pod's GPUs fit in the node's NVLink domain,
    else ``pcie`` (the scheduler does not pick GPUs; this is the better case of the node).
    """
    env: dict[str, str] = {}
    product = node_labels.get(keys.NODE_GPU_PRODUCT) or node_labels.get(keys.NODE_PROBE_GPU_PRODUCT)
    if product:
        env["KNEEPOINT_SIM_GPU"] = product
    interconnect = node_labels.get(keys.NODE_INTERCONNECT)
    if interconnect in ("nvlink", "pcie"):
        env["KNEEPOINT_SIM_INTERCONNECT"] = interconnect
    elif interconnect == "mixed":
        try:
            domain = int(node_labels.get(keys.NODE_NVLINK_DOMAIN_SIZE, "1"))
        except ValueError:
            domain = 1
        env["KNEEPOINT_SIM_INTERCONNECT"] = "nvlink" if max(gpus, 1) <= domain else "pcie"
    gbps = node_labels.get(keys.NODE_INTER_NODE_GBPS)
    if gbps:
        env["KNEEPOINT_SIM_INTER_NODE_GBPS"] = gbps
    return env


def simulator_env(
    pod: Mapping[str, Any], container: Mapping[str, Any], argv: Sequence[str], node_labels: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """(defaults, overrides) of a simulator's env.

    Defaults (the pod's own env wins): a short model load, POD_NAME/POD_NAMESPACE/
    CONTAINER_NAME for the DCGM labels. Overrides: the hardware, from the node's labels,
    since a pod cannot choose the GPU it lands on. The simulator's own flags (``--gpu``,
    ``--interconnect``) still win over both, as flags do over env.
    """
    metadata = pod.get("metadata") or {}
    gpus = gpu_request(container)
    if gpus == 0:
        try:
            tp = int(_flag_value(argv, "--tensor-parallel-size", "-tp") or 1)
            pp = int(_flag_value(argv, "--pipeline-parallel-size", "-pp") or 1)
            gpus = tp * pp
        except ValueError:
            gpus = 1
    defaults = {
        "KNEEPOINT_SIM_MODEL_LOAD_SECONDS": DEFAULT_MODEL_LOAD_SECONDS,
        "POD_NAME": str(metadata.get("name", "")),
        "POD_NAMESPACE": str(metadata.get("namespace", "")),
        "CONTAINER_NAME": str(container.get("name", "")),
    }
    hardware = hardware_env(node_labels, gpus)
    if multi_node_count(argv) < 2:
        # Stages of a single-node replica talk over the node's own links; only the leader of a
        # replica that spans nodes (vLLM --nnodes > 1) sends activations over the inter-node link.
        hardware.pop("KNEEPOINT_SIM_INTER_NODE_GBPS", None)
    return defaults, hardware


def plan_container(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    python: str,
    pod_ip: str,
    host_ip: str,
    node: Mapping[str, Any],
    sources: EnvSources,
    runtime_env: Mapping[str, str],
    forced_env: Mapping[str, str],
    volume_dirs: Mapping[str, str] | None = None,
) -> ContainerPlan:
    """The process, env and listen address of one container.

    ``runtime_env`` holds the runner's stand-ins a pod may override (Kubernetes service
    env, ``KNEEPOINT_RESOLVE``); ``forced_env`` those it may not (``KUBECONFIG``,
    ``TERMINATION_MESSAGE_PATH``: they point at files only the runner writes). ``command``
    and ``args`` get ``$(VAR)`` expansion against the final env, as in the kubelet.
    ``volume_dirs`` (volume name -> a per-pod directory, see :func:`emptydir_volumes`):
    the sandbox has no mount namespace, so a mount path of such a volume in the argv or env
    is replaced by its directory (two containers of a pod then share it, as an emptyDir).
    Raises ContainerConfigError or ContainerCommandError.
    """
    name = str(container.get("name", ""))
    image = str(container.get("image") or "")
    metadata = pod.get("metadata") or {}
    defaults = {**IMAGE_ENV, "HOSTNAME": str(metadata.get("name", "")), **runtime_env}
    probe_env = container_env(pod, container, pod_ip=pod_ip, host_ip=host_ip, node=node, sources=sources, defaults=defaults)
    # The container's own words only: the runner's interpreter (which may itself live under a path a
    # mount shadows, e.g. a checkout in /tmp beside an emptyDir at /tmp) and its forced env stay as they are.
    mounts = mount_paths(container, volume_dirs or {})
    expanded = dict(container)
    for key in ("command", "args"):
        if container.get(key):
            expanded[key] = [rewrite_mount_paths(expand_references(str(w), probe_env), mounts) for w in container[key]]
    kind, argv, listen = container_argv(expanded, python, pod_ip)
    overrides: dict[str, str] = {}
    if is_simulator(kind, argv):
        node_labels = (node.get("metadata") or {}).get("labels") or {}
        sim_defaults, overrides = simulator_env(pod, container, argv, node_labels)
        defaults = {**defaults, **sim_defaults}
    env = container_env(pod, container, pod_ip=pod_ip, host_ip=host_ip, node=node, sources=sources, defaults=defaults)
    env.update(overrides)
    if mounts:
        env = {k: rewrite_mount_paths(v, mounts) for k, v in env.items()}
    env.update(forced_env)
    return ContainerPlan(name=name, image=image, kind=kind, argv=tuple(argv), env=env, listen=listen)


def emptydir_volumes(pod: Mapping[str, Any]) -> list[str]:
    """Names of the pod's disk-backed emptyDir volumes (``medium: Memory`` ones stay as they are: /dev/shm)."""
    names = []
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        empty = volume.get("emptyDir")
        if isinstance(empty, dict) and empty.get("medium") != "Memory":
            names.append(str(volume.get("name", "")))
    return names


def mount_paths(container: Mapping[str, Any], volume_dirs: Mapping[str, str]) -> dict[str, str]:
    """Mount path -> directory for the container's mounts of the given volumes."""
    out = {}
    for mount in container.get("volumeMounts") or []:
        directory = volume_dirs.get(str(mount.get("name", "")))
        path = str(mount.get("mountPath") or "").rstrip("/")
        if directory and path:
            out[path] = directory
    return out


def rewrite_mount_paths(word: str, mounts: Mapping[str, str]) -> str:
    """``word`` with every mount path (as a whole path prefix) replaced by its directory."""
    for path, directory in sorted(mounts.items(), key=lambda item: -len(item[0])):
        word = re.sub(re.escape(path) + r"(?=/|\"|'|$|\s|,)", _literal(directory), word)
    return word


def _literal(text: str) -> Callable[[re.Match[str]], str]:
    """A re.sub replacement that inserts ``text`` as it is (no backslash escapes)."""
    return lambda _match: text


# ---------------------------------------------------------------------------------------
# Probes


def container_port(container: Mapping[str, Any], port: Any) -> int:
    """A probe's or Service's ``port``: an integer, or the name of one of the container's ports.

    Returns 0 when a name matches no port.
    """
    if isinstance(port, int):
        return port
    text = str(port)
    if text.isdigit():
        return int(text)
    for entry in container.get("ports") or []:
        if entry.get("name") == text:
            return int(entry.get("containerPort", 0))
    return 0


def probe_spec(container: Mapping[str, Any], which: str, pod_ip: str) -> ProbeSpec | None:
    """The container's ``readinessProbe`` or ``startupProbe`` (``which``), None when absent."""
    probe = container.get(which)
    if not probe:
        return None
    timing: dict[str, Any] = {
        "initial_delay_seconds": float(probe.get("initialDelaySeconds") or 0),
        "period_seconds": float(probe.get("periodSeconds") or 10),
        "timeout_seconds": float(probe.get("timeoutSeconds") or 1),
        "success_threshold": int(probe.get("successThreshold") or 1),
        "failure_threshold": int(probe.get("failureThreshold") or 3),
    }
    if "httpGet" in probe:
        get = probe["httpGet"] or {}
        headers = tuple((str(h.get("name", "")), str(h.get("value", ""))) for h in get.get("httpHeaders") or [])
        return ProbeSpec(
            action="http",
            # A probe's host defaults to the pod IP; a named host outside loopback is never dialled.
            host=pod_ip,
            port=container_port(container, get.get("port")),
            path=str(get.get("path") or "/"),
            scheme=str(get.get("scheme") or "HTTP").upper(),
            headers=headers,
            **timing,
        )
    if "tcpSocket" in probe:
        return ProbeSpec(action="tcp", host=pod_ip, port=container_port(container, (probe["tcpSocket"] or {}).get("port")), **timing)
    if "grpc" in probe:
        return ProbeSpec(action="grpc", host=pod_ip, port=int((probe["grpc"] or {}).get("port") or 0), **timing)
    return ProbeSpec(action="exec", **timing)


# ---------------------------------------------------------------------------------------
# Credentials


def service_account_token_source(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The projected serviceAccountToken source the ServiceAccount admission plugin added.

    None when the pod (or its ServiceAccount) opts out of automounting: such a pod gets no
    API credentials, as in a cluster.
    """
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        for source in ((volume.get("projected") or {}).get("sources")) or []:
            token = source.get("serviceAccountToken")
            if token is not None:
                return dict(token)
    return None


def build_pod_kubeconfig(server: str, ca_data_b64: str, token_file: str, namespace: str) -> str:
    """A kubeconfig (JSON, which is YAML) for a pod's ServiceAccount token.

    The token is read from ``token_file`` (``tokenFile``), which the runner rewrites before
    the token expires, like the kubelet's projected token; clients re-read it on 401.
    """
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "sandbox", "cluster": {"server": server, "certificate-authority-data": ca_data_b64}}],
        "users": [{"name": "pod", "user": {"tokenFile": token_file}}],
        "contexts": [{"name": "pod", "context": {"cluster": "sandbox", "user": "pod", "namespace": namespace}}],
        "current-context": "pod",
    }
    return json.dumps(config, indent=2) + "\n"
