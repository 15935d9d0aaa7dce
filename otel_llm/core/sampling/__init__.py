"""Sampling: the policy interface, the policies (one module per family) and the registry that builds them from config.

``base``: ``TraceView``, ``Decision``, ``Policy``, ``first_match``. ``request``: what the SDK decides with
(errors, SLO breaches, slow percentiles, a probabilistic baseline, the SDK's recorded decision).
``trace``, ``attributes``, ``limits``, ``composite``: upstream ``tail_sampling``'s vocabulary, which the
collector uses. ``registry``: config entry -> validated ``PolicySpec`` -> policy.
"""

from .attributes import BooleanAttributePolicy, NumericAttributePolicy, StringAttributePolicy
from .base import NOT_SAMPLED, Decision, OptionError, Policy, TraceView, Verdict, attribute_keys, first_match
from .composite import AndPolicy, CompositePolicy, DropPolicy, FirstMatchPolicy, NotPolicy
from .limits import BytesLimitingPolicy, RateLimitingPolicy
from .request import (AlwaysSample, ErrorPolicy, LatencyPercentilePolicy, ProbabilisticPolicy, RecordedReasonPolicy,
                      SLOPolicy)
from .trace import LatencyPolicy, SpanCountPolicy, StatusCodePolicy

__all__ = [
    "NOT_SAMPLED", "AlwaysSample", "AndPolicy", "BooleanAttributePolicy", "BytesLimitingPolicy", "CompositePolicy",
    "Decision", "DropPolicy", "ErrorPolicy", "FirstMatchPolicy", "LatencyPercentilePolicy", "LatencyPolicy",
    "NotPolicy", "NumericAttributePolicy", "OptionError", "Policy", "ProbabilisticPolicy", "RateLimitingPolicy",
    "RecordedReasonPolicy", "SLOPolicy", "SpanCountPolicy", "StatusCodePolicy", "StringAttributePolicy", "TraceView",
    "Verdict", "attribute_keys", "first_match",
]
