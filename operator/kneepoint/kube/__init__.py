"""Kubernetes adapters: everything that knows Kubernetes object shapes or talks to the API.

Pure builders (no client import, unit-tested against exact dicts): ``crd_schema`` (the
ParallelismExperiment CRD and its API reference, generated from the core dataclasses),
``naming`` (child names, labels, annotation keys), ``manifests`` (engine Deployment,
Service and load-test Job as plain dicts). Modules that call the API server are the only
ones here that import the ``kubernetes`` client.
"""
