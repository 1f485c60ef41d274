"""kopf wiring only: startup settings, the per-experiment daemon and child-event wake-ups.

Importing ``kneepoint.handlers.experiment`` registers the handlers with kopf.
"""
