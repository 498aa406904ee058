"""Comparing a command's JSON with its committed output: equal, floats to 1e-9 relative."""

from __future__ import annotations

import math


def same_json(made, committed) -> bool:
    """Equal JSON, floats to 1e-9 relative: a sum's last bits differ between CPUs (a
    variance factor came out ...704 on one host and ...713 on another)."""
    if isinstance(made, float) or isinstance(committed, float):
        return (isinstance(made, (int, float)) and isinstance(committed, (int, float))
                and math.isclose(made, committed, rel_tol=1e-9, abs_tol=1e-12))
    if isinstance(made, dict) and isinstance(committed, dict):
        return made.keys() == committed.keys() and all(same_json(made[k], committed[k])
                                                       for k in made)
    if isinstance(made, list) and isinstance(committed, list):
        return len(made) == len(committed) and all(map(same_json, made, committed))
    return made == committed
