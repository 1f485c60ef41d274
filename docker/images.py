"""``make images``: build kneepoint's container images with buildah and run them as the cluster does.

    .venv/bin/python docker/images.py               # what `make images` runs
    .venv/bin/python docker/images.py --base python:3.11.13-slim-bookworm   # a registry's base

1. Tools: buildah (builds with ``--isolation chroot``: no daemon, no cgroup set-up),
   debootstrap (the base) and runc (runs the checks): installed with apt-get when missing
   and run as root, else one line says what is missing.
2. Base: Debian bookworm made by ``debootstrap --variant=minbase
   --include=python3,python3-venv,ca-certificates`` from the mirror apt uses (read from
   /etc/apt/sources.list*), cached as a tar in ~/.cache/kneepoint/images/ keyed by suite
   and UTC date (a new one each day; older tars are removed), and imported without a
   registry: ``buildah from scratch``, the tar unpacked into its mount, ``buildah commit``.
3. Build: ``buildah bud --layers`` of every Dockerfile with ``BASE_IMAGE`` set to that base,
   tagged with the reference the chart uses by default (repository from values.yaml, tag
   the chart's appVersion).
4. Check: each image runs under runc the way its pod runs it: the image's own USER,
   ENTRYPOINT, ENV and WORKDIR, the root filesystem read-only, no capabilities, no
   privilege escalation, and writable only what the pod mounts (WORKLOADS below). Main
   image: ``kneepoint --version``, its venv holds exactly requirements/runtime.txt's
   versions, ``kneepoint operator --help``, ``kneepoint sim`` in the background and
   ``kneepoint loadgen`` against it (its summary read back from /dev/termination-log, as
   the operator reads it). Load-generator image: ``kneepoint --version``, its venv is
   requirements/loadgen.txt, and its loadgen against a simulator from the main image (it
   has none).
5. Sizes: every image's size as buildah stores it (uncompressed) and the sum of its layers
   gzip-compressed (about what a push sends and a pull fetches).

Exit status 0 when every image built and every check passed; 1 on a failed check or
build; 2 when a tool, root or the Debian mirror is missing (one line says which).
A JSON summary (timings, sizes, checks) goes to ~/.cache/kneepoint/images/last-run.json.

Standard library only: it runs before and outside the project's venv as well.
tests/images/test_images.py runs it (KNEEPOINT_IMAGES=1) and unit-tests its pure parts.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("KNEEPOINT_IMAGES_CACHE", Path.home() / ".cache" / "kneepoint" / "images"))
SUITE = "bookworm"
# What the base holds besides minbase: the interpreter, its venv module (ensurepip's pip),
# and the CA bundle pip needs.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
# Debian package of each command this needs.
TOOLS = {"buildah": "buildah", "debootstrap": "debootstrap", "runc": "runc"}
BASE_REPOSITORY = "localhost/kneepoint-base"
NON_ROOT = "65532:65532"
SIM_MODEL = "llama-3-8b"


@dataclass(frozen=True)
class Image:
    dockerfile: str
    repository: str  # the chart's values (image.repository) for the main image


@dataclass(frozen=True)
class Workload:
    """How one of the cluster's pods runs the image: what, besides nothing, is writable.

    Taken from the objects that run it (tests/images/test_images.py keeps them equal):
    the chart's Deployment (operator), kube/manifests.py's Simulate-mode engine and
    load-test Job. All three set readOnlyRootFilesystem, drop ALL capabilities and forbid
    privilege escalation.
    """

    name: str
    tmp_mib: int | None  # an emptyDir at /tmp, with the chart's sizeLimit
    termination_log: bool  # the kubelet's /dev/termination-log file
    dirs: tuple[str, ...] = ()  # other emptyDirs the pod mounts writable (the engine's profiler traces)
    # /dev/shm: every runtime mounts one (64 MiB here, like containerd's default); the
    # engine pod's own Memory emptyDir there is the same thing for the simulator.


WORKLOADS = {
    "operator": Workload("operator (chart Deployment)", tmp_mib=64, termination_log=False),
    # kube/manifests.py PROFILES_DIR: the engine writes its profiler traces there, the trace sidecar reads them.
    "engine": Workload("Simulate-mode engine (Deployment)", tmp_mib=None, termination_log=False, dirs=("/var/run/kneepoint/profiles",)),
    "loadtest": Workload("load-test Job", tmp_mib=None, termination_log=True),
}


def chart_reference() -> tuple[str, str]:
    """(repository, tag) the chart's Deployment runs by default: image.repository, appVersion."""
    values = (ROOT / "charts" / "kneepoint" / "values.yaml").read_text()
    chart = (ROOT / "charts" / "kneepoint" / "Chart.yaml").read_text()
    repository = re.search(r"^image:\n(?:  .*\n)*?  repository: (\S+)", values, re.M)
    app_version = re.search(r"^appVersion: \"?([^\"\s]+)\"?", chart, re.M)
    if not repository or not app_version:
        raise SystemExit("charts/kneepoint: no image.repository in values.yaml or appVersion in Chart.yaml")
    return repository.group(1), app_version.group(1)


def images() -> list[Image]:
    repository, _ = chart_reference()
    return [Image("Dockerfile", repository), Image("Dockerfile.loadgen", f"{repository}-loadgen")]


# --------------------------------------------------------------------------- small helpers


class Failed(Exception):
    """A build or check failed; the message says which and why."""


class Missing(Exception):
    """Something this machine lacks (a tool, root, a mirror); the message is one line."""


def log(message: str) -> None:
    print(f"[images] {message}", file=sys.stderr, flush=True)


def run(
    argv: list[str], *, check: bool = True, capture: bool = True, timeout: float | None = None, **kw: Any
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=capture, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        detail = ((proc.stdout or "") + (proc.stderr or ""))[-4000:] if capture else ""
        raise Failed(f"{' '.join(argv[:4])} ... exited {proc.returncode}\n{detail}")
    return proc


def human(size: int) -> str:
    return f"{size / 1e6:.0f} MB"


# --------------------------------------------------------------------------- tools


def missing_tools() -> list[str]:
    return [package for command, package in TOOLS.items() if shutil.which(command) is None]


def ensure_tools() -> None:
    if os.geteuid() != 0:
        raise Missing("needs root (debootstrap, and buildah/runc without user namespaces set up)")
    packages = missing_tools()
    if not packages:
        return
    if shutil.which("apt-get") is None:
        raise Missing(f"needs {', '.join(packages)} (Debian packages of those names) and no apt-get is here")
    log(f"installing {' '.join(packages)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-q"], env=env, timeout=600)
    run(["apt-get", "install", "-y", "-q", *packages], env=env, timeout=1200)
    still = missing_tools()
    if still:
        raise Missing(f"apt-get installed {' '.join(packages)} but {', '.join(still)} is still not on PATH")


# --------------------------------------------------------------------------- the Debian mirror


@dataclass(frozen=True)
class Source:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]


def parse_sources(text: str, deb822: bool) -> list[Source]:
    """apt's sources: one-line ``deb [opts] URI SUITE COMPONENT...`` or deb822 paragraphs."""
    found: list[Source] = []
    if not deb822:
        for raw in text.splitlines():
            line = raw.split("#", 1)[0].strip()
            line = re.sub(r"\[[^\]]*\]", " ", line)
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb":
                found.append(Source(parts[1], (parts[2],), tuple(parts[3:])))
        return found
    for paragraph in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = ""
        for raw in paragraph.splitlines():
            if raw.lstrip().startswith("#"):
                continue
            if raw[:1] in (" ", "\t") and key:
                fields[key] += " " + raw.strip()
            elif ":" in raw:
                key, _, value = raw.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            found.append(Source(uri, tuple(fields.get("suites", "").split()), tuple(fields.get("components", "").split())))
    return found


def debian_mirror(suite: str, etc: Path = Path("/etc/apt")) -> str:
    """The Debian archive apt uses here (KNEEPOINT_DEBIAN_MIRROR overrides).

    Prefers an entry for ``suite`` itself, then any other Debian main archive (a host on
    another release still has the mirror); never a -security or -updates suite alone,
    which debootstrap cannot bootstrap from.
    """
    override = os.environ.get("KNEEPOINT_DEBIAN_MIRROR")
    if override:
        return override
    sources: list[Source] = []
    files = [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*"))] if etc.exists() else []
    for path in files:
        if path.is_file() and path.suffix in (".list", ".sources"):
            sources += parse_sources(path.read_text(errors="replace"), deb822=path.suffix == ".sources")
    main = [s for s in sources if "main" in s.components and not s.uri.startswith(("file:", "cdrom:"))]
    for candidates in ([s for s in main if suite in s.suites], [s for s in main if any(re.fullmatch(r"[a-z]+", x) for x in s.suites)]):
        if candidates:
            return candidates[0].uri
    raise Missing(f"no Debian archive with component main in {etc}/sources.list*: set KNEEPOINT_DEBIAN_MIRROR")


# --------------------------------------------------------------------------- the base


def image_exists(name: str) -> bool:
    return run(["buildah", "inspect", "--type", "image", name], check=False).returncode == 0


def base_name(suite: str, day: str) -> str:
    return f"{BASE_REPOSITORY}:{suite}-{day}"


def make_base_tar(suite: str, day: str, timings: dict[str, float]) -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    tar = CACHE / f"base-{suite}-{day}.tar"
    if tar.exists():
        log(f"base root filesystem: {tar} (cached)")
        return tar
    mirror = debian_mirror(suite)
    rootfs = CACHE / f"rootfs-{suite}-{day}.partial"
    shutil.rmtree(rootfs, ignore_errors=True)
    log(f"debootstrap {suite} (minbase + {', '.join(BASE_PACKAGES)}) from apt's mirror {mirror}")
    started = time.monotonic()
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", suite, str(rootfs), mirror]
    run(argv, timeout=1800)
    # What debootstrap leaves that no image needs: downloaded .debs and the package lists.
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for path in (rootfs / leftover).glob("*"):
            if path.is_file():
                path.unlink()
    packages = run(["chroot", str(rootfs), "dpkg-query", "-W", "-f", "${Package}=${Version}\\n"]).stdout
    (CACHE / f"base-{suite}-{day}.packages").write_text(packages)
    partial = tar.with_suffix(".tar.partial")
    run(["tar", "-C", str(rootfs), "--numeric-owner", "--xattrs", "-cf", str(partial), "."], timeout=600)
    partial.rename(tar)
    shutil.rmtree(rootfs, ignore_errors=True)
    for old in CACHE.glob(f"base-{suite}-*.*"):
        if day not in old.name:
            old.unlink()
    timings["debootstrap_s"] = round(time.monotonic() - started, 1)
    log(f"base root filesystem: {tar} ({human(tar.stat().st_size)}, {timings['debootstrap_s']} s)")
    return tar


def ensure_base(suite: str, timings: dict[str, float]) -> str:
    day = time.strftime("%Y%m%d", time.gmtime())
    name = base_name(suite, day)
    if image_exists(name):
        log(f"base image: {name} (already in buildah's storage)")
        return name
    tar = make_base_tar(suite, day, timings)
    started = time.monotonic()
    container = run(["buildah", "from", "--pull=never", "scratch"]).stdout.strip()
    try:
        mount = run(["buildah", "mount", container]).stdout.strip()
        run(["tar", "-C", mount, "--numeric-owner", "--xattrs", "-xpf", str(tar)], timeout=600)
        run(["buildah", "umount", container])
        run(
            [
                "buildah", "config",
                "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env", "LANG=C.UTF-8",
                "--cmd", "/bin/bash",
                "--label", f"org.opencontainers.image.title=debian-{suite}-minbase-python3",
                "--label", f"org.opencontainers.image.created={day}",
                container,
            ]
        )  # fmt: skip # argv: each flag beside its value
        run(["buildah", "commit", "--rm", "--quiet", container, name], timeout=600)
    except BaseException:
        run(["buildah", "rm", container], check=False)
        raise
    timings["base_import_s"] = round(time.monotonic() - started, 1)
    log(f"base image: {name} (imported in {timings['base_import_s']} s)")
    return name


# --------------------------------------------------------------------------- build


def host_ca_bundle() -> Path | None:
    """The build host's CA bundle, bind-mounted over the base's for the build's RUN steps
    only (pip behind a TLS-inspecting proxy); never part of an image."""
    path = Path("/etc/ssl/certs/ca-certificates.crt")
    return path if path.is_file() else None


def build(image: Image, tag: str, base: str, pull: str) -> float:
    argv = [
        "buildah", "bud", "--isolation", "chroot", "--layers", f"--pull={pull}",
        "--build-arg", f"BASE_IMAGE={base}",
        "-f", str(ROOT / image.dockerfile), "-t", tag,
    ]  # fmt: skip # argv: each flag beside its value
    bundle = host_ca_bundle()
    if bundle is not None:
        argv += ["--volume", f"{bundle}:/etc/ssl/certs/ca-certificates.crt:ro"]
    log(f"building {tag} from {image.dockerfile} on {base}")
    started = time.monotonic()
    proc = subprocess.run([*argv, str(ROOT)], capture_output=True, text=True, timeout=3600)
    elapsed = round(time.monotonic() - started, 1)
    if proc.returncode != 0:
        raise Failed(f"build of {tag} failed after {elapsed} s:\n{(proc.stdout + proc.stderr)[-6000:]}")
    log(f"built {tag} in {elapsed} s")
    return elapsed


# --------------------------------------------------------------------------- run under runc


def image_config(name: str) -> dict[str, Any]:
    data = json.loads(run(["buildah", "inspect", "--type", "image", name]).stdout)
    return data["OCIv1"].get("config", {})


def parse_user(user: str) -> tuple[int, int]:
    """The image's USER as uid and gid: numeric only (runAsNonRoot checks need numbers)."""
    match = re.fullmatch(r"(\d+)(?::(\d+))?", user or "")
    if not match:
        raise Failed(f"image USER {user!r} is not numeric uid[:gid]")
    uid = int(match.group(1))
    return uid, int(match.group(2) or uid)


def oci_config(
    template: dict[str, Any], rootfs: str, config: dict[str, Any], argv: list[str], workload: Workload, termination_log: Path | None
) -> dict[str, Any]:
    """An OCI runtime config that runs ``argv`` from the image as ``workload``'s pod does.

    ``template`` is ``runc spec``'s default. The network namespace is the host's (the
    simulator and the load generator talk over loopback, as over a pod network); cgroups
    are left alone (limits are the cluster's business, and this host's hybrid cgroup
    layout is what stops crun and podman).
    """
    spec = json.loads(json.dumps(template))
    uid, gid = parse_user(config.get("User", ""))
    env = list(config.get("Env") or [])
    if not any(e.startswith("HOME=") for e in env):
        env.append("HOME=/")  # the kubelet's HOME for a user without an /etc/passwd entry
    spec["root"] = {"path": rootfs, "readonly": True}
    process = spec["process"]
    process.update(
        {
            "terminal": False,
            "args": argv,
            "env": env,
            "cwd": config.get("WorkingDir") or "/",
            "user": {"uid": uid, "gid": gid},
            "noNewPrivileges": True,  # allowPrivilegeEscalation: false
            # capabilities: drop: [ALL]
            "capabilities": {k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")},
        }
    )
    process.pop("rlimits", None)  # the runtime's own limits, like a kubelet's containers
    linux = spec["linux"]
    linux["namespaces"] = [n for n in linux["namespaces"] if n["type"] not in ("network", "cgroup")]
    linux.pop("resources", None)
    mounts = [m for m in spec["mounts"] if m["destination"] not in ("/sys/fs/cgroup", "/tmp")]
    if workload.tmp_mib is not None:
        mounts.append(
            {
                "destination": "/tmp",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "nodev", "mode=1777", f"size={workload.tmp_mib}m"],
            }
        )
    for path in workload.dirs:
        mounts.append({"destination": path, "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]})
    if workload.termination_log:
        if termination_log is None:
            raise ValueError("a load-test Job's container needs a termination-log file")
        mounts.append({"destination": "/dev/termination-log", "type": "bind", "source": str(termination_log), "options": ["rbind", "rw"]})
    spec["mounts"] = mounts
    spec["hostname"] = "kneepoint-check"
    return spec


_RUNC_TEMPLATE: dict[str, Any] | None = None


def runc_template() -> dict[str, Any]:
    global _RUNC_TEMPLATE
    if _RUNC_TEMPLATE is None:
        with tempfile.TemporaryDirectory(prefix="kneepoint-runc-") as where:
            run(["runc", "spec", "--bundle", where])
            _RUNC_TEMPLATE = json.loads((Path(where) / "config.json").read_text())
    return _RUNC_TEMPLATE


@dataclass
class Container:
    """One image run under runc; ``wait`` or ``stop`` it, then ``cleanup``."""

    image: str
    workload: Workload
    argv: list[str]
    id: str = ""
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kneepoint-check-")))
    proc: subprocess.Popen[str] | None = None
    termination_log: Path | None = None
    log: Any = None  # the container's stdout and stderr, a file in ``work``

    def start(self) -> Container:
        self.id = f"kneepoint-check-{os.getpid()}-{next(_SEQUENCE)}"
        run(["buildah", "from", "--pull=never", "--name", self.id, self.image])
        rootfs = run(["buildah", "mount", self.id]).stdout.strip()
        config = image_config(self.image)
        if self.workload.termination_log:
            self.termination_log = self.work / "termination-log"
            self.termination_log.write_text("")
            self.termination_log.chmod(0o666)  # the kubelet's file is writable by any user
        spec = oci_config(runc_template(), rootfs, config, self.argv, self.workload, self.termination_log)
        (self.work / "config.json").write_text(json.dumps(spec, indent=1))
        self.log = (self.work / "output.log").open("w+")
        self.proc = subprocess.Popen(
            ["runc", "run", "--bundle", str(self.work), self.id],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        return self

    def output(self) -> str:
        self.log.flush()
        return (self.work / "output.log").read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise Failed(f"{' '.join(self.argv)} in {self.image} ran past {timeout:.0f} s:\n{self.output()[-3000:]}") from None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            run(["runc", "kill", self.id, "TERM"], check=False)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                run(["runc", "kill", self.id, "KILL"], check=False)
                self.proc.wait(timeout=20)

    def cleanup(self) -> None:
        self.stop()
        if self.id:
            run(["runc", "delete", "--force", self.id], check=False)
            run(["buildah", "umount", self.id], check=False)
            run(["buildah", "rm", self.id], check=False)
        with contextlib.suppress(Exception):
            self.log.close()
        shutil.rmtree(self.work, ignore_errors=True)


_SEQUENCE = iter(range(1, 1_000_000))


@contextlib.contextmanager
def container(image: str, workload: Workload, argv: list[str]) -> Iterator[Container]:
    box = Container(image, workload, argv)
    try:
        yield box.start()
    finally:
        box.cleanup()


def run_once(image: str, workload: Workload, argv: list[str], timeout: float = 180) -> tuple[int, str, str]:
    """Run to the end: exit code, output, and what it wrote to /dev/termination-log."""
    with container(image, workload, argv) as box:
        code = box.wait(timeout)
        termination = box.termination_log.read_text() if box.termination_log else ""
        return code, box.output(), termination


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, box: Container, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if box.proc is not None and box.proc.poll() is not None:
            raise Failed(f"the simulator exited {box.proc.returncode} before it was healthy:\n{box.output()[-3000:]}")
        with contextlib.suppress(urllib.error.URLError, OSError), urllib.request.urlopen(url, timeout=2) as response:
            if response.status == 200:
                return
        time.sleep(0.5)
    raise Failed(f"the simulator did not answer {url} within {timeout:.0f} s:\n{box.output()[-3000:]}")


# --------------------------------------------------------------------------- checks


@dataclass
class Check:
    image: str
    name: str
    passed: bool = False
    seconds: float = 0.0
    detail: str = ""


def entrypoint(config: dict[str, Any]) -> list[str]:
    return list(config.get("Entrypoint") or [])


def expect(code: int, output: str, wanted: str, what: str) -> None:
    if code != 0 or wanted not in output:
        raise Failed(f"{what}: exit {code}, expected {wanted!r} in the output:\n{output[-3000:]}")


def lock_versions(name: str) -> dict[str, str]:
    """``name -> version`` of a requirements/ lock file (names normalized as pip does)."""
    text = (ROOT / "requirements" / name).read_text()
    return {re.sub(r"[-_.]+", "-", m.group(1)).lower(): m.group(2) for m in re.finditer(r"^([A-Za-z0-9._-]+)==(\S+)", text, re.M)}


# Prints every distribution in the image's venv as name==version (pip is removed there).
LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m, re\n"
    "for d in m.distributions(): print(re.sub(r'[-_.]+', '-', d.metadata['Name']).lower() + '==' + d.version)\n"
)


def check_locked(image: str, lock: str, version: str) -> str:
    """The image's venv holds exactly the lock's versions (the test suite's) and kneepoint."""
    code, output, _ = run_once(image, WORKLOADS["operator"], ["python3", "-c", LIST_DISTRIBUTIONS])
    if code != 0:
        raise Failed(f"listing the distributions failed ({code}):\n{output[-2000:]}")
    found = dict(line.split("==", 1) for line in output.split() if "==" in line)
    wanted = {**lock_versions(lock), "kneepoint": version}
    if found != wanted:
        extra = sorted(set(found.items()) - set(wanted.items()))
        missing = sorted(set(wanted.items()) - set(found.items()))
        raise Failed(f"the venv differs from requirements/{lock}: extra {extra}, missing {missing}")
    return f"{len(found)} distributions, all at requirements/{lock}'s versions"


def loadgen_argv(port: int) -> list[str]:
    """A short fixed workload (the operator's Job passes the same kind of flags)."""
    return [
        "--endpoint", f"http://127.0.0.1:{port}", "--model", SIM_MODEL,
        "--concurrency", "4", "--num-requests", "40", "--input-len", "128", "--output-len", "16",
        "--seed", "0", "--max-error-fraction", "0", "--no-progress",
    ]  # fmt: skip # argv: each flag beside its value


def check_loadgen_against_sim(sim_image: str, loadgen_image: str, loadgen_prefix: list[str]) -> str:
    port = free_port()
    sim = [
        "kneepoint",
        "sim",
        "--model",
        SIM_MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dcgm-port",
        "0",
        "--model-load-seconds",
        "0",
    ]
    with container(sim_image, WORKLOADS["engine"], sim) as engine:
        wait_healthy(f"http://127.0.0.1:{port}/health", engine, timeout=180)
        code, output, termination = run_once(loadgen_image, WORKLOADS["loadtest"], [*loadgen_prefix, *loadgen_argv(port)])
        if code != 0:
            raise Failed(f"kneepoint loadgen exited {code}:\n{output[-3000:]}\nsimulator:\n{engine.output()[-2000:]}")
        try:
            summary = json.loads(termination)
        except json.JSONDecodeError:
            raise Failed(f"/dev/termination-log holds no JSON summary: {termination[:500]!r}\n{output[-2000:]}") from None
        if summary.get("ok") is not True:
            raise Failed(f"the load test's summary is not ok: {termination[:1000]}")
        engine.stop()
        if engine.proc is not None and engine.proc.returncode not in (0, -15, 143):
            raise Failed(f"the simulator exited {engine.proc.returncode} on SIGTERM:\n{engine.output()[-2000:]}")
    return termination[:300]


def run_checks(tags: dict[str, str], version: str) -> list[Check]:
    main, loadgen = tags["Dockerfile"], tags["Dockerfile.loadgen"]
    results: list[Check] = []

    def attempt(image: str, name: str, body: Any) -> None:
        check = Check(image, name)
        started = time.monotonic()
        try:
            check.detail = body() or ""
            check.passed = True
        except (Failed, subprocess.TimeoutExpired) as error:
            check.detail = str(error)
        check.seconds = round(time.monotonic() - started, 1)
        log(f"{'PASS' if check.passed else 'FAIL'} {image}: {name} ({check.seconds} s)" + ("" if check.passed else f"\n{check.detail}"))
        results.append(check)

    def config_check(image: str) -> str:
        config = image_config(image)
        if config.get("User") != NON_ROOT:
            raise Failed(f"USER is {config.get('User')!r}, the chart runs {NON_ROOT}")
        if parse_user(config["User"])[0] == 0:
            raise Failed("USER is root")
        return f"User {config['User']}, Entrypoint {entrypoint(config)}, WorkingDir {config.get('WorkingDir')}"

    def main_version() -> str:
        code, output, _ = run_once(main, WORKLOADS["operator"], [*entrypoint(image_config(main)), "--version"])
        expect(code, output, f"version {version}", "kneepoint --version")
        return output.strip()

    def main_operator_help() -> str:
        code, output, _ = run_once(main, WORKLOADS["operator"], [*entrypoint(image_config(main)), "operator", "--help"])
        expect(code, output, "--prometheus-url", "kneepoint operator --help")
        return "operator --help lists --prometheus-url"

    def loadgen_version() -> str:
        # The Job's `command: [kneepoint, ...]` replaces ENTRYPOINT the same way.
        code, output, _ = run_once(loadgen, WORKLOADS["loadtest"], ["kneepoint", "--version"])
        expect(code, output, f"version {version}", "kneepoint --version")
        return output.strip()

    attempt(main, "USER is the chart's non-root runAsUser", lambda: config_check(main))
    attempt(main, "kneepoint --version (read-only root, /tmp emptyDir)", main_version)
    attempt(main, "its venv is requirements/runtime.txt exactly", lambda: check_locked(main, "runtime.txt", version))
    attempt(main, "kneepoint operator --help (read-only root, /tmp emptyDir)", main_operator_help)
    attempt(
        main,
        "kneepoint loadgen against kneepoint sim, both from this image (read-only roots)",
        lambda: check_loadgen_against_sim(main, main, entrypoint(image_config(main)) + ["loadgen"]),
    )
    attempt(loadgen, "USER is the chart's non-root runAsUser", lambda: config_check(loadgen))
    attempt(loadgen, "kneepoint --version (read-only root)", loadgen_version)
    attempt(loadgen, "its venv is requirements/loadgen.txt exactly", lambda: check_locked(loadgen, "loadgen.txt", version))
    attempt(
        loadgen,
        "its ENTRYPOINT (kneepoint loadgen) against kneepoint sim from the main image",
        lambda: check_loadgen_against_sim(main, loadgen, entrypoint(image_config(loadgen))),
    )
    return results


# --------------------------------------------------------------------------- sizes


def sizes(tag: str) -> dict[str, int]:
    """The image's layers as tars (its size unpacked) and gzip-compressed (about what a push
    sends and a pull fetches), counted from a ``buildah push`` to a directory."""
    uncompressed = compressed = 0
    with tempfile.TemporaryDirectory(prefix="kneepoint-size-") as where:
        run(["buildah", "push", "--quiet", "--disable-compression", tag, f"dir:{where}"], timeout=900)
        manifest = json.loads((Path(where) / "manifest.json").read_text())
        for layer in manifest["layers"]:
            path = Path(where) / layer["digest"].split(":", 1)[1]
            uncompressed += path.stat().st_size
            counter = _Counter()
            with path.open("rb") as src, gzip.GzipFile(fileobj=counter, mode="wb", compresslevel=6, mtime=0) as dst:  # type: ignore[arg-type]
                shutil.copyfileobj(src, dst, 1 << 20)
            compressed += counter.count
    return {"uncompressed_bytes": uncompressed, "compressed_bytes": compressed, "layers": len(manifest["layers"])}


class _Counter:
    """A write-only file that only counts the bytes gzip writes to it."""

    def __init__(self) -> None:
        self.count = 0

    def write(self, data: bytes) -> int:
        self.count += len(data)
        return len(data)

    def flush(self) -> None:
        pass


# --------------------------------------------------------------------------- main


def project_version() -> str:
    match = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    if not match:
        raise SystemExit("pyproject.toml: no version")
    return match.group(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", help="build on this image (pulled when absent) instead of the debootstrap base")
    parser.add_argument("--suite", default=SUITE, help=f"Debian suite of the debootstrap base (default {SUITE})")
    parser.add_argument("--no-sizes", action="store_true", help="skip the compressed-size count")
    args = parser.parse_args(argv)

    started = time.monotonic()
    timings: dict[str, float] = {}
    summary: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        step = time.monotonic()
        ensure_tools()
        timings["tools_s"] = round(time.monotonic() - step, 1)
        if args.base:
            base, pull = args.base, "missing"
        else:
            base, pull = ensure_base(args.suite, timings), "never"
        summary["base"] = base
        repository, chart_tag = chart_reference()
        version = project_version()
        if chart_tag != version:
            raise Failed(f"the chart's appVersion {chart_tag} is not pyproject.toml's version {version}")
        tags = {image.dockerfile: f"{image.repository}:{chart_tag}" for image in images()}
        for image in images():
            timings[f"build {image.dockerfile}_s"] = build(image, tags[image.dockerfile], base, pull)
        step = time.monotonic()
        checks = run_checks(tags, version)
        timings["checks_s"] = round(time.monotonic() - step, 1)
        summary["checks"] = [check.__dict__ for check in checks]
        summary["sizes"] = {}
        if not args.no_sizes:
            step = time.monotonic()
            for tag in [base, *tags.values()]:
                summary["sizes"][tag] = sizes(tag)
            timings["sizes_s"] = round(time.monotonic() - step, 1)
    except Missing as error:
        print(f"make images: {error}", file=sys.stderr)
        return 2
    except Failed as error:
        log(f"FAILED: {error}")
        return 1
    timings["total_s"] = round(time.monotonic() - started, 1)
    summary["timings"] = timings
    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE / "last-run.json").write_text(json.dumps(summary, indent=1) + "\n")
    failed = [c for c in checks if not c.passed]
    print(f"\nbase: {base}")
    for name, seconds in timings.items():
        print(f"  {name.removesuffix('_s'):<28} {seconds:>7.1f} s")
    for tag, size in summary["sizes"].items():
        print(f"  {tag:<44} {human(size['uncompressed_bytes']):>8} ({human(size['compressed_bytes'])} compressed, {size['layers']} layers)")
    print(f"checks: {len(checks) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
