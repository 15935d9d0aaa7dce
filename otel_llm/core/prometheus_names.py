"""OpenTelemetry metric names as Prometheus writes them: dots to underscores, the unit as a suffix.

The same translation as the upstream Collector's Prometheus exporter (and OpenTelemetry's
Prometheus compatibility rules for the units we use): ``s`` becomes ``_seconds``, ``{token}/s``
``_per_second``, an annotation in braces is dropped. Counters get ``_total`` where they are
exposed. Used by the collector's Prometheus endpoint and by the dashboard's queries, so both
name a metric the same way.
"""

from __future__ import annotations

import re

_BAD = re.compile(r"[^a-zA-Z0-9_:]")


def prom_name(name: str, unit: str) -> str:
    base = _BAD.sub("_", name)
    unit = re.sub(r"\{[^}]*\}", "", unit or "")
    if unit == "s":
        base += "_seconds"
    elif unit.endswith("/s"):
        base += ("_" + _BAD.sub("_", unit[:-2]) if unit[:-2] else "") + "_per_second"
    elif unit:
        base += "_" + _BAD.sub("_", unit)
    return base


def prom_label(key: str) -> str:
    """An attribute key as a Prometheus label name."""
    return _BAD.sub("_", key)
