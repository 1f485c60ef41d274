"""Text of the wrapper go.mod files that the sandbox builds its binaries from.

Pure: given a :class:`~kneepoint.sandbox.pins.GoBuild`, returns the go.mod that goes into
``build/<name>-<version>/`` before ``go mod tidy``. ``tool`` lines keep the main packages
in the module graph (a tools.go file cannot import a main package).
"""

from __future__ import annotations

from kneepoint.sandbox.pins import GoBuild


def wrapper_gomod(build: GoBuild) -> str:
    """The seed go.mod for ``build``: module, go line, godebug, require, replace, tool."""
    lines = [f"module {build.module_path}", "", f"go {build.go_directive}", ""]
    if build.godebug:
        # Same GODEBUG defaults as upstream's own go.mod for this release.
        lines += [f"godebug {build.godebug}", ""]
    lines += _block("require", [f"{mod} {ver}" for mod, ver in build.requires])
    if build.replaces:
        lines += _block("replace", [f"{old} => {new} {ver}" for old, new, ver in build.replaces])
    lines += _block("tool", [pkg for _, pkg in build.outputs])
    return "\n".join(lines).rstrip("\n") + "\n"


def _block(keyword: str, entries: list[str]) -> list[str]:
    return [f"{keyword} ("] + [f"\t{entry}" for entry in entries] + [")", ""]


def gomod_replaces(text: str) -> dict[str, str]:
    """``old => new version`` pairs of a go.mod's replace directives (module -> 'new version')."""
    out: dict[str, str] = {}
    in_block = False
    for raw in text.splitlines():
        line = raw.split("//", 1)[0].strip()
        if line.startswith("replace ("):
            in_block = True
            continue
        if in_block and line == ")":
            in_block = False
            continue
        if line.startswith("replace "):
            line = line[len("replace ") :]
        elif not in_block:
            continue
        if "=>" in line:
            old, new = (part.strip() for part in line.split("=>", 1))
            out[old.split()[0]] = new
    return out
