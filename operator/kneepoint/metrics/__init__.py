"""Prometheus adapters: PromQL text (pure) and the reader that runs it over a tier's window."""
