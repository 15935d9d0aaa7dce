"""Collector-only speed-ups, built from the core's public tables (so the derivation still exists once, in the core).

``summary``: the core's ``RequestSummary`` derivation over still-encoded span attributes (``ATTRIBUTE_SLOTS``,
``CONVERTERS``, ``RequestSummary.from_slots``). ``metrics``: the core's server metrics recorded a list of
requests at a time into the collector's aggregation backend (the core's ``Instruments`` and label sets).
``wire`` (+ the C extension ``_wire``, optional): the receivers' one validating pass over a request, its tables
derived from the installed OTLP descriptors.
"""
