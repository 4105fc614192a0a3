"""The native engine's admission rule, pure (no torch): shared by the engine's loop
(``engine.py``'s ``_admissions``) and the fused pipeline's simulator (``tools/sim_fused.py``)."""

from __future__ import annotations


def hold_admission(
    hold_ms: float,
    hold_requests: int,
    waiting: int,
    free: int,
    active: int,
    waited_ms: float,
    min_rows: int = 1,
) -> bool:
    """Whether the loop holds ``waiting`` requests back this iteration (``admit_hold_ms``): only
    while at least ``min_rows`` (and at least one) ``active`` rows decode (an idle or lightly
    loaded engine admits at once), until the oldest has waited ``hold_ms`` or ``hold_requests``
    wait (or as many as the ``free`` slots take)."""
    if hold_ms <= 0 or active < max(1, min_rows) or waiting < 1 or free < 1:
        return False
    return waiting < min(hold_requests, free) and waited_ms < hold_ms


__all__ = ["hold_admission"]
