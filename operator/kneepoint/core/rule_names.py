"""Names of the stop rules (defined once: the rules, the decision's status enum and the ladder use them)."""

from __future__ import annotations

MEMORY_HEADROOM = "memory-headroom"
THROUGHPUT_GAIN = "throughput-gain"
P99_DEGRADATION = "p99-degradation"
COMM_FRACTION = "comm-fraction"
LAST_TIER = "last-tier"
BUDGET = "budget"
ONLY_TIER = "only-tier"

RULES = (MEMORY_HEADROOM, THROUGHPUT_GAIN, P99_DEGRADATION, COMM_FRACTION, LAST_TIER, BUDGET, ONLY_TIER)
"""Every rule that can name a decision (status.decision.rule's allowed values)."""
