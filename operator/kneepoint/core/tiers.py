"""The TP/PP ladder: which tiers an experiment tries, in which order, and their names."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Tier:
    """One parallelism tier: a replica uses tensor_parallel x pipeline_parallel GPUs."""

    tensor_parallel: int
    pipeline_parallel: int = 1

    @property
    def gpus(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def name(self) -> str:
        """DNS-label-safe name used in child object names and status (``tp2-pp1``)."""
        return f"tp{self.tensor_parallel}-pp{self.pipeline_parallel}"

    @property
    def label(self) -> str:
        """Short human label as in the comparison block (``TP2``, ``TP8xPP2``)."""
        if self.pipeline_parallel == 1:
            return f"TP{self.tensor_parallel}"
        return f"TP{self.tensor_parallel}xPP{self.pipeline_parallel}"


def build_ladder(tensor_parallel: tuple[int, ...] | list[int], pipeline_parallel: tuple[int, ...] | list[int]) -> list[Tier]:
    """Every TP size at the smallest PP size, then larger PP sizes at the largest TP size.

    This is the method's order: add GPUs with TP inside one NVLink domain first; PP only
    "where TP stops". Input lists are assumed validated (increasing, no repeats).
    """
    tps = sorted(set(tensor_parallel))
    pps = sorted(set(pipeline_parallel))
    ladder = [Tier(tp, pps[0]) for tp in tps]
    ladder += [Tier(tps[-1], pp) for pp in pps[1:]]
    return ladder


def parse_tier_name(name: str) -> Tier:
    """Inverse of :attr:`Tier.name`; raises ValueError on anything else."""
    try:
        tp_part, pp_part = name.split("-")
        if not (tp_part.startswith("tp") and pp_part.startswith("pp")):
            raise ValueError
        return Tier(int(tp_part[2:]), int(pp_part[2:]))
    except ValueError:
        raise ValueError(f"not a tier name: {name!r} (expected tpN-ppM)") from None
