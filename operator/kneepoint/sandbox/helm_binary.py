"""Build (once) and locate the pinned helm binary that lints and renders ``charts/kneepoint``.

helm is a Go module like the sandbox's other components, so it is built the same way and
into the same cache layout (``bin/helm-<version>/helm``, wrapper module under
``build/helm-<version>/``) by :func:`kneepoint.sandbox.binaries.ensure_go_build`. It is kept
out of ``pins.all_builds()``: ``kneepoint sandbox up`` never needs it, only the chart's
tests and CI do.

``python -m kneepoint.sandbox.helm_binary`` builds it if missing and prints its path.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from kneepoint.sandbox import binaries, pins


def ensure_helm(env: Mapping[str, str] | None = None, say: binaries.Say = binaries.say_flush) -> Path:
    """Build the pinned helm if missing (minutes, once) and return its path.

    Raises :class:`kneepoint.sandbox.binaries.BuildError` when Go is missing or too old, or
    the build fails (the message names the log).
    """
    env = dict(os.environ if env is None else env)
    build = pins.helm_build()
    return binaries.ensure_go_build(build, env, say) / "helm"


def main() -> int:
    """Build helm if needed; print its path."""
    try:
        path = ensure_helm()
    except binaries.BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
