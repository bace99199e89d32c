"""Argument checks shared by the performance model's modules: numbers, non-negative numbers,
positive integers, each refused with a ValueError that names the argument and its value."""

from __future__ import annotations

import math

import numpy as np


def _number(name, value, inf=False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} is {value!r}, expected a number")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not inf):
        raise ValueError(f"{name} is {value!r}, expected a finite number")
    return v


def _nonneg(name, value) -> float:
    v = _number(name, value)
    if v < 0:
        raise ValueError(f"{name} is {value!r}, expected a number >= 0")
    return v


def _positive_int(name, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, (float, np.floating)) and float(value).is_integer() and value >= 1:
            return int(value)
        raise ValueError(f"{name} is {value!r}, expected a positive integer")
    if value < 1:
        raise ValueError(f"{name} is {value!r}, expected a positive integer")
    return int(value)


def _nonneg_int(name, value) -> int:
    """An integer >= 0 (0 allowed, unlike _positive_int)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return _positive_int(name, value + 1) - 1
    except (TypeError, ValueError):
        raise ValueError(f"{name} is {value!r}, expected an integer >= 0") from None
