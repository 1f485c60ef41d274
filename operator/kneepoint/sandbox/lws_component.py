"""LeaderWorkerSet (sigs.k8s.io/lws) as an optional sandbox component: config, certificate, CRDs, webhooks.

Multi-node tiers run as a LeaderWorkerSet, so a sandbox that profiles them runs the LWS
controller like the other control-plane binaries: built from its Go module
(``pins.lws_build``), started on the host, talking to the API server with the admin
kubeconfig. Its webhooks are required in practice (the pod webhook writes the group-index
and worker-index labels and the LWS_* env the controllers and pods rely on), and the API
server must reach them: here by URL (``https://127.0.0.1:<port>/<path>``) with the
sandbox CA as ``caBundle`` and a serving certificate for ``IP:127.0.0.1``, as LWS's own
envtest does. Leader election and LWS's internal certificate management are off.

The pure parts (ports, the Configuration, argv, webhook URLs) are in ``lws_config``; this
module reads the packaged files, and :func:`vendor_crds` refreshes the CRD copies in
``kneepoint/data`` from the module cache. ``controlplane`` applies and starts it.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from kneepoint.sandbox import lws_config, pins

DATA = "sandbox/lws"
CRD_FILES = ("leaderworkerset.x-k8s.io_leaderworkersets.json", "disaggregatedset.x-k8s.io_disaggregatedsets.json")


def webhook_configurations(webhook_port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """The packaged webhook configurations, pointed at the controller on loopback (``lws_config.url_webhooks``)."""
    text = importlib.resources.files("kneepoint.data").joinpath(f"{DATA}/webhooks.yaml").read_text()
    return lws_config.url_webhooks([d for d in yaml.safe_load_all(text) if d], webhook_port, ca_pem)


DIGEST_ANNOTATION = "kneepoint.io/source-digest"


def crd_documents() -> list[dict[str, Any]]:
    """The packaged CRDs, each annotated with a digest of its file (so an unchanged one need not be applied again)."""
    documents = []
    for path in crd_files():
        data = path.read_bytes()
        document = json.loads(data)
        document["metadata"].setdefault("annotations", {})[DIGEST_ANNOTATION] = hashlib.sha256(data).hexdigest()[:16]
        documents.append(document)
    return documents


def crd_files() -> list[Path]:
    """The packaged CRD copies (LeaderWorkerSet and DisaggregatedSet: the controller watches both)."""
    root = importlib.resources.files("kneepoint.data").joinpath(DATA)
    return [Path(str(root.joinpath(name))) for name in CRD_FILES]


def _strip_descriptions(node: Any) -> Any:
    """The schema without its prose: a ``description`` key with a string value (a property named
    description has a mapping value and stays)."""
    if isinstance(node, dict):
        return {k: _strip_descriptions(v) for k, v in node.items() if not (k == "description" and isinstance(v, str))}
    if isinstance(node, list):
        return [_strip_descriptions(v) for v in node]
    return node


def vendor_crds(module_dir: Path, out_dir: Path) -> list[Path]:
    """Copy the CRDs from the LWS module (``config/crd/bases``) as compact JSON without descriptions.

    The upstream YAML is 2.8 MB, nearly all of it field descriptions of the embedded pod
    template; the schema (types, defaults, enums, CEL rules) is kept whole (260 kB).
    """
    written = []
    for name in CRD_FILES:
        source = module_dir / "config" / "crd" / "bases" / name.replace(".json", ".yaml")
        document = _strip_descriptions(yaml.safe_load(source.read_text()))
        target = out_dir / name
        target.write_text(json.dumps(document, separators=(",", ":"), sort_keys=False) + "\n")
        written.append(target)
    return written


def main(argv_: list[str] | None = None) -> int:
    """``python -m kneepoint.sandbox.lws_component GOMODCACHE``: refresh the packaged CRD copies."""
    args = argv_ if argv_ is not None else sys.argv[1:]
    if len(args) != 1:
        print("usage: python -m kneepoint.sandbox.lws_component GOMODCACHE  (e.g. $(go env GOMODCACHE))", file=sys.stderr)
        return 2
    module_dir = Path(args[0]) / "sigs.k8s.io" / f"lws@{pins.LWS_VERSION}"
    if not module_dir.is_dir():
        print(f"error: {module_dir}: not found (build LWS first: kneepoint sandbox up --with-lws)", file=sys.stderr)
        return 2
    out_dir = Path(__file__).resolve().parents[1] / "data" / "sandbox" / "lws"
    for path in vendor_crds(module_dir, out_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
