"""The sandbox: a real Kubernetes control plane on loopback with simulated GPU nodes.

Pure modules (standard library only, unit-tested without a cluster): ``pins`` (versions
and build recipes), ``gomod`` (wrapper go.mod text), ``fleet`` (fleet document -> Node
objects), ``layout`` (paths and ports), ``flags`` (each component's command line),
``promconfig`` (Prometheus configuration).
Adapters: ``binaries`` (go build into the cache), ``pki`` (openssl), ``processes``
(detached processes, pid files, health), ``controlplane`` (up/down/status), ``command``
(the ``kneepoint sandbox`` CLI). ``runner*`` modules belong to the pod runner.
"""
