"""Renderings of an experiment for people: the knee chart (PNG) and the text/Markdown/JSON report.

Kept apart from ``kneepoint.commands`` so the renderers take plain core types (spec,
tiers, decision, status mapping) and can be tested without a command line or a cluster.
"""
