"""Plain values for JSON: the one helper every writer of results uses."""

from __future__ import annotations

import json
import math

import numpy as np


def plain(obj):
    """obj with NumPy scalars as Python numbers, tuples as lists, dict keys as str, and
    inf/nan as None (JSON has neither)."""
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        return v if math.isfinite(v) else None
    return obj


def is_json(value) -> bool:
    """Whether json.dumps takes value as it is."""
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False
