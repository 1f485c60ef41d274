"""Build (once per version) and locate the binaries the sandbox runs.

Go components are built from their modules into the cache: ``build/<name>-<version>/``
holds the generated wrapper go.mod, go.sum, ``ldflags`` and ``build.log``; the binaries
land in ``bin/<name>-<version>/``. A binary that exists is never rebuilt; each one is
linked to a temporary name and renamed, so an interrupted build leaves no half-written
binary behind and the next run resumes with what is missing. Prometheus comes from
Debian's package, unpacked with ``dpkg -x`` (no daemon, no root install).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kneepoint.sandbox import gomod, layout, pins, processes

Say = Callable[[str], None]


def say_flush(line: str) -> None:
    """Print one progress line at once, even when stdout is a file or a pipe."""
    print(line, flush=True)


MIN_GO = (1, 26)


class BuildError(RuntimeError):
    """A binary could not be built or fetched; the message says what to do."""


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of every executable one sandbox needs."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kwok: Path
    prometheus: Path

    def as_dict(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.__dict__.items()}


def bin_dir(build: pins.GoBuild, env: Mapping[str, str]) -> Path:
    """Directory of ``build``'s binaries in the cache."""
    return layout.cache_root(env) / "bin" / build.key


def build_dir(build: pins.GoBuild, env: Mapping[str, str]) -> Path:
    """Directory of ``build``'s wrapper module in the cache."""
    return layout.cache_root(env) / "build" / build.key


def missing_binaries(build: pins.GoBuild, env: Mapping[str, str]) -> list[str]:
    """Binaries of ``build`` not yet in the cache."""
    target = bin_dir(build, env)
    return [name for name in build.binaries if not os.access(target / name, os.X_OK)]


def ensure_all(env: Mapping[str, str] | None = None, say: Say = say_flush) -> Binaries:
    """Build or fetch whatever is missing and return the paths of every binary."""
    env = dict(os.environ if env is None else env)
    builds = {b.name: b for b in pins.all_builds()}
    started = time.monotonic()
    built = False
    for build in builds.values():
        built = bool(missing_binaries(build, env)) or built
        ensure_go_build(build, env, say)
    if built:
        say(f"[sandbox] all binaries ready after {_fmt(time.monotonic() - started)} (cached for later runs)")
    return _paths(builds, env)


def _paths(builds: Mapping[str, pins.GoBuild], env: Mapping[str, str]) -> Binaries:
    k8s = bin_dir(builds["k8s"], env)
    return Binaries(
        etcd=bin_dir(builds["etcd"], env) / "etcd",
        kube_apiserver=k8s / "kube-apiserver",
        kube_controller_manager=k8s / "kube-controller-manager",
        kube_scheduler=k8s / "kube-scheduler",
        kubectl=k8s / "kubectl",
        kwok=bin_dir(builds["kwok"], env) / "kwok",
        prometheus=bin_dir(builds["prometheus"], env) / "prometheus",
    )


def find_all(env: Mapping[str, str] | None = None) -> Binaries | None:
    """Paths of every binary if all are already present, else None (builds nothing)."""
    env = dict(os.environ if env is None else env)
    builds = {b.name: b for b in pins.all_builds()}
    if any(missing_binaries(b, env) for b in builds.values()):
        return None
    return _paths(builds, env)


# --- Go builds ---------------------------------------------------------------------------


def go_version(go: str) -> tuple[int, int]:
    """(major, minor) of the go command, e.g. (1, 26)."""
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout
    match = re.match(r"go(\d+)\.(\d+)", out.strip())
    if not match:
        raise BuildError(f"cannot read the Go version from {out.strip()!r}")
    return int(match.group(1)), int(match.group(2))


def find_go() -> str:
    """Path of a go command new enough for the pinned modules, or BuildError saying what to install."""
    go = shutil.which("go") or next((p for p in ("/usr/local/go/bin/go",) if os.access(p, os.X_OK)), None)
    if go is None:
        raise BuildError(
            f"the sandbox builds its Kubernetes binaries from Go modules and needs Go >= {MIN_GO[0]}.{MIN_GO[1]} on PATH (go not found)"
        )
    version = go_version(go)
    if version < MIN_GO:
        raise BuildError(
            f"go {version[0]}.{version[1]} at {go} is too old: Kubernetes {pins.KUBERNETES_VERSION} needs Go >= {MIN_GO[0]}.{MIN_GO[1]}"
        )
    return go


def ensure_go_build(build: pins.GoBuild, env: Mapping[str, str], say: Say = say_flush) -> Path:
    """Build the missing binaries of ``build``; returns its bin directory."""
    target = bin_dir(build, env)
    if not missing_binaries(build, env):
        return target
    # One build per version at a time (a user's `up` and a test session may both start one).
    lock = layout.cache_root(env) / "build" / f".{build.key}.lock"
    with processes.exclusive_lock(lock, say, f"building {build.key}"):
        missing = missing_binaries(build, env)
        if missing:
            _build_missing(build, env, say, missing)
    return target


def _build_missing(build: pins.GoBuild, env: Mapping[str, str], say: Say, missing: list[str]) -> None:
    target = bin_dir(build, env)
    go = find_go()
    work = build_dir(build, env)
    work.mkdir(parents=True, exist_ok=True)
    target.mkdir(parents=True, exist_ok=True)
    go_env = {**env, "CGO_ENABLED": "0"}
    say(f"[sandbox] building {', '.join(missing)} ({build.key}) from Go modules into {target}")
    say(f"[sandbox] first build only: this takes minutes on a small machine; later runs reuse {target}")
    started = time.monotonic()
    log = work / "build.log"
    _prepare_module(build, work, go, go_env, say, log)
    (work / "ldflags").write_text(build.ldflags + "\n")
    for name in missing:
        package = dict(build.outputs)[name]
        _go_build_one(go, go_env, work, target, name, package, build.ldflags, build.tags, say, log)
    say(f"[sandbox] {build.key}: built {len(missing)} binaries in {_fmt(time.monotonic() - started)}")


def _prepare_module(build: pins.GoBuild, work: Path, go: str, go_env: Mapping[str, str], say: Say, log: Path) -> None:
    """Write the wrapper go.mod and run ``go mod tidy``, unless this exact seed was tidied before."""
    seed = gomod.wrapper_gomod(build)
    seed_file = work / "go.mod.seed"
    tidy_done = (work / "go.mod").exists() and (work / "go.sum").exists()
    if tidy_done and seed_file.exists() and seed_file.read_text() == seed:
        return
    if tidy_done and not seed_file.exists() and _same_pins(build, (work / "go.mod").read_text()):
        # A module tidied by hand from the same recipe (same requires and replaces): keep it.
        seed_file.write_text(seed)
        return
    (work / "go.mod").write_text(seed)
    (work / "go.sum").unlink(missing_ok=True)
    say(f"[sandbox] {build.key}: go mod tidy (downloads modules through the Go module proxy)")
    started = time.monotonic()
    with log.open("a") as out:
        out.write(f"== go mod tidy {time.strftime('%H:%M:%S')}\n")
        out.flush()
        proc = subprocess.run([go, "mod", "tidy"], cwd=work, env=dict(go_env), stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise BuildError(f"go mod tidy failed in {work} (exit {proc.returncode}); see {log}")
    seed_file.write_text(seed)
    say(f"[sandbox] {build.key}: go mod tidy done in {_fmt(time.monotonic() - started)}")


def _same_pins(build: pins.GoBuild, text: str) -> bool:
    wanted = {old: f"{new} {ver}" for old, new, ver in build.replaces}
    requires_ok = all(re.search(rf"^\s*(require\s+)?{re.escape(m)} {re.escape(v)}\b", text, re.M) for m, v in build.requires)
    return requires_ok and gomod.gomod_replaces(text) == wanted and f"module {build.module_path}" in text


def _go_build_one(
    go: str,
    go_env: Mapping[str, str],
    work: Path,
    target: Path,
    name: str,
    package: str,
    ldflags: str,
    tags: tuple[str, ...],
    say: Say,
    log: Path,
) -> None:
    """``go build`` one binary to a temporary name in ``target``, then rename it into place."""
    tmp = target / f".{name}.tmp-{os.getpid()}"
    argv = [go, "build", "-v", "-trimpath", "-ldflags", ldflags, "-o", str(tmp)]
    if tags:
        argv += ["-tags", ",".join(tags)]
    argv.append(package)
    say(f"[sandbox]   {name}: compiling {package}")
    started = time.monotonic()
    with log.open("a") as out:
        out.write(f"== {name} {time.strftime('%H:%M:%S')}\n")
        out.flush()
        proc = subprocess.Popen(argv, cwd=work, env=dict(go_env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        counter = _ProgressCounter(name, started, say)
        counter.start()
        try:
            for line in proc.stdout:
                out.write(line)
                counter.packages += 1
        finally:
            code = proc.wait()
            counter.stop()
    if code != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"go build of {name} failed (exit {code}); see {log}")
    os.chmod(tmp, 0o755)
    os.replace(tmp, target / name)
    took = time.monotonic() - started
    with log.open("a") as out:
        out.write(f"== {name} done in {took:.0f}s\n")
    say(f"[sandbox]   {name}: done in {_fmt(took)} ({counter.packages} packages compiled)")


class _ProgressCounter(threading.Thread):
    """Prints a line every 30 s while a long go build runs, so the user sees it move."""

    def __init__(self, name: str, started: float, say: Say) -> None:
        super().__init__(daemon=True)
        self.name_ = name
        self.started = started
        self.say = say
        self.packages = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(30):
            elapsed = time.monotonic() - self.started
            self.say(f"[sandbox]   {self.name_}: {self.packages} packages compiled, {_fmt(elapsed)} so far")

    def stop(self) -> None:
        self._stop_event.set()


def _fmt(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def main(argv: list[str] | None = None) -> int:
    """``python -m kneepoint.sandbox.binaries``: build everything missing (used by CI warm-up)."""
    try:
        paths = ensure_all()
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, path in paths.as_dict().items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
