"""Kubernetes adapters: everything that knows Kubernetes object shapes or talks to the API.

Pure builders (no client import, unit-tested against exact dicts): ``crd_schema`` (the
ParallelismExperiment CRD, generated from the core dataclasses), ``api_doc`` (its API
reference, docs/api.md, rendered from that schema),
``naming`` (child names, labels, annotation keys), ``manifests`` (engine Deployment,
Service and load-test Job as plain dicts). Modules that call the API server are the only
ones here that import the ``kubernetes`` client.
"""
