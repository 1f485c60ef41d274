"""Rank balance of a TP group from DCGM per GPU: does every GPU of the split do its share?

The seed method's check: a TP group whose GPUs differ in utilisation or memory beyond a
limit is a split that does not work as intended (one rank waits for another, or holds
more than its shard). The finding reports the trace reader's ``rankSkewFraction`` next to
it, since waiting inside collectives is how such imbalance shows in the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

UTILIZATION_SPREAD_LIMIT = 0.15
"""Largest minus smallest mean utilisation (0-1) over the group's GPUs above which the split is uneven."""
MEMORY_SPREAD_LIMIT = 0.10
"""Largest minus smallest peak framebuffer use, as a share of the largest, above which the split is uneven."""
SPLIT_NOT_EFFECTIVE = "the parallel split is not effective"


@dataclass(frozen=True)
class RankBalance:
    utilization_spread: float | None
    memory_spread_gib: float | None
    finding: str | None


def rank_balance(utilization_by_gpu: Sequence[float], fb_used_gib_by_gpu: Sequence[float], rank_skew_fraction: float | None) -> RankBalance:
    """Spreads over the tier's GPUs, and the finding when one passes its limit (needs 2+ GPUs)."""
    util = max(utilization_by_gpu) - min(utilization_by_gpu) if len(utilization_by_gpu) >= 2 else None
    mem = max(fb_used_gib_by_gpu) - min(fb_used_gib_by_gpu) if len(fb_used_gib_by_gpu) >= 2 else None
    reasons = []
    if util is not None and util > UTILIZATION_SPREAD_LIMIT:
        reasons.append(
            f"GPU utilisation {min(utilization_by_gpu):.2f}-{max(utilization_by_gpu):.2f} across {len(utilization_by_gpu)} GPUs "
            f"(spread {util:.2f} > {UTILIZATION_SPREAD_LIMIT:.2f})"
        )
    if mem is not None and max(fb_used_gib_by_gpu) > 0 and mem / max(fb_used_gib_by_gpu) > MEMORY_SPREAD_LIMIT:
        reasons.append(
            f"memory {min(fb_used_gib_by_gpu):.1f}-{max(fb_used_gib_by_gpu):.1f} GiB across {len(fb_used_gib_by_gpu)} GPUs "
            f"(spread {mem / max(fb_used_gib_by_gpu):.2f} of the largest > {MEMORY_SPREAD_LIMIT:.2f})"
        )
    finding = None
    if reasons:
        skew = "n/a" if rank_skew_fraction is None else f"{rank_skew_fraction:.2f}"
        finding = f"{SPLIT_NOT_EFFECTIVE}: {'; '.join(reasons)}; rankSkewFraction {skew}"
    return RankBalance(
        utilization_spread=None if util is None else round(util, 3),
        memory_spread_gib=None if mem is None else round(mem, 2),
        finding=finding,
    )
