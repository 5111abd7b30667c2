"""Which runs can be compared: one rule for the regression gate (``traceprof diff``) and for
baseline sets (``traceprof baseline add``), so that a set is refused when it is made, not when it
is first diffed.

Runs are comparable when all are on GPUs or all CPU-only (a run is a GPU run when it has kernels,
memcpys or memsets) and, where both record one, their world sizes are equal: per-rank step times of
another device kind or job size differ by design, not by regression.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from traceprof.storage.store import Store

__all__ = ["Kind", "kind_of", "differences"]


@dataclass(frozen=True)
class Kind:
    """What the rule reads of a run: its ``name``, whether it is a GPU run, its world size
    (``runs.world_size``; None: unknown)."""

    name: str
    gpu: bool
    world_size: int | None


def kind_of(store: Store, run_id: int) -> Kind:
    """The :class:`Kind` of run ``run_id``.

    Source: ``runs.name``, ``runs.world_size``; ``events.kind`` (kernel, memcpy, memset: a GPU run).
    One indexed lookup and an EXISTS scan of the run's events that stops at the first GPU row.
    """
    info = store.sql(
        """SELECT name, world_size, EXISTS (SELECT 1 FROM events e WHERE e.run_id = r.run_id
                                            AND e.kind IN ('kernel', 'memcpy', 'memset')) AS gpu
           FROM runs r WHERE run_id = ?""",
        [run_id],
    ).row(0, named=True)
    return Kind(info["name"], bool(info["gpu"]), info["world_size"])


def differences(bases: Sequence[Kind], cand: Kind) -> list[str]:
    """Why ``cand`` cannot be compared with ``bases`` (module doc), one phrase per difference,
    each once, in the order found; [] when it can."""
    why: list[str] = []
    for b in bases:
        if b.gpu != cand.gpu:
            why.append(
                f"{b.name!r} is {'a GPU' if b.gpu else 'a CPU-only'} run, {cand.name!r} "
                f"{'a GPU' if cand.gpu else 'a CPU-only'} run"
            )
        if b.world_size is not None and cand.world_size is not None and b.world_size != cand.world_size:
            why.append(f"world size {b.world_size} vs {cand.world_size}")
    return list(dict.fromkeys(why))
