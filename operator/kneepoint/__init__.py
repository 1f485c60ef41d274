"""kneepoint: decide, with measurements, how many GPUs one LLM inference replica should use.

The package is layered (checked by import-linter contracts in pyproject/.importlinter):
``core`` is pure (standard library only); ``kube`` and ``metrics`` adapt it to Kubernetes and
Prometheus; ``handlers`` wires kopf to the reconciler. ``loadgen``, ``simulator``, ``sandbox``
and ``nodeprobe`` are separate subpackages with the same pure/adapter split inside.
"""

__version__ = "0.1.0"
