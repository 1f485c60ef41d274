"""Re-vendor KServe's files used by tests/contract/test_kserve_export.py.

    python tests/data/kserve/vendor.py GIT_DIR COMMIT

GIT_DIR is a clone of github.com/kserve/kserve. Writes, from COMMIT:
- inferenceservice-v1beta1.schema.json: config/crd/full/serving.kserve.io_inferenceservices.yaml,
  version v1beta1's openAPIV3Schema with descriptions removed and spec reduced to predictor
  (the only component the export sets);
- kserve-huggingfaceserver.yaml, kserve-huggingfaceserver-multinode.yaml: config/runtimes/, verbatim;
- SOURCE.md's commit line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def show(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True, capture_output=True, text=True).stdout


def strip(node):
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def main(git_dir: str, commit: str) -> None:
    crd = yaml.safe_load(show(git_dir, commit, "config/crd/full/serving.kserve.io_inferenceservices.yaml"))
    schema = strip(next(v for v in crd["spec"]["versions"] if v["name"] == "v1beta1")["schema"]["openAPIV3Schema"])
    spec = schema["properties"]["spec"]
    spec["properties"] = {"predictor": spec["properties"]["predictor"]}
    (HERE / "inferenceservice-v1beta1.schema.json").write_text(json.dumps(schema, sort_keys=True, separators=(",", ":")) + "\n")
    for name in ("kserve-huggingfaceserver.yaml", "kserve-huggingfaceserver-multinode.yaml"):
        (HERE / name).write_text(show(git_dir, commit, f"config/runtimes/{name}"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
