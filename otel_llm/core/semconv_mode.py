"""Which version of the GenAI conventions we emit: read from ``OTEL_SEMCONV_STABILITY_OPT_IN`` once, when an
instrumentor is instrumented, as the contrib GenAI instrumentations read it.

``OTEL_SEMCONV_STABILITY_OPT_IN`` is a comma-separated list; ``gen_ai_latest_experimental`` in it selects the
latest experimental GenAI conventions (opentelemetry-instrumentation's ``_semconv``, which openai-v2 and
util-genai use, reads it the same way: split on commas, each value stripped, compared exactly). Without it, the
names the contrib instrumentations emit by default. The choice decides the client's metric set
(``core/client_metrics.py``) and how ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` is read
(``core/config.py``); the default flips when the conventions have a release (docs/changelog.md).
"""

from __future__ import annotations

import os
from typing import Mapping

from .. import semconv as sc


def genai_latest(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``OTEL_SEMCONV_STABILITY_OPT_IN`` asks for the latest experimental GenAI conventions."""
    env = os.environ if environ is None else environ
    return sc.GENAI_LATEST_EXPERIMENTAL in (v.strip() for v in env.get(sc.SEMCONV_OPT_IN_ENV, "").split(","))
