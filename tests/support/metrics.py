"""Reading an OpenTelemetry SDK reader's collected metrics back by name (tests, demo)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any


def points_by_name(data: Any) -> dict[str, list[Any]]:
    """Every data point of ``MetricsData`` (or ``None``: nothing recorded yet), grouped by metric name."""
    out: dict[str, list[Any]] = defaultdict(list)
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name].extend(m.data.data_points)
    return out
