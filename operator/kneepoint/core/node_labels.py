"""Node label and annotation keys (CONTRACTS D), defined once.

Two writers: NVIDIA GPU Feature Discovery (``nvidia.com/``) and kneepoint's node probe
(``kneepoint.io/``). The operator reads them to place tiers, the probe writes its own, the
sandbox's fleet puts both on its fake nodes and its pod runner reads them back for the
simulator's hardware. Every one of those imports the key from here.
"""

from __future__ import annotations

GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource that counts NVIDIA GPUs (device plugin)."""

# GFD's labels.
GFD_PREFIX = "nvidia.com/"
NODE_GPU_PRESENT = "nvidia.com/gpu.present"
NODE_GPU_PRODUCT = "nvidia.com/gpu.product"
NODE_GPU_COUNT = "nvidia.com/gpu.count"
NODE_GPU_MEMORY = "nvidia.com/gpu.memory"

# The node probe's labels (nodeprobe/node_labels.py computes them).
PROBE_PREFIX = "kneepoint.io/"
NODE_PROBE_GPU_PRODUCT = "kneepoint.io/gpu-product"
NODE_PROBE_GPU_COUNT = "kneepoint.io/gpu-count"
NODE_PROBE_GPU_MEMORY_MIB = "kneepoint.io/gpu-memory-mib"
NODE_NVLINK_DOMAIN = "kneepoint.io/nvlink-domain"
NODE_NVLINK_DOMAIN_SIZE = "kneepoint.io/nvlink-domain-size"
NODE_NVLINK_DOMAINS = "kneepoint.io/nvlink-domains"
NODE_INTERCONNECT = "kneepoint.io/interconnect"
NODE_GPU_TOPOLOGY_ANNOTATION = "kneepoint.io/gpu-topology"

# Set by whoever knows the fabric between nodes (not the probe: it sees one node).
NODE_INTER_NODE_GBPS = "kneepoint.io/inter-node-gbps"
