"""The upstream Collector's configuration structure, as test data: field names, types, required keys.

Transcribed by hand from the upstream Go sources and their generated ``config.schema.yaml`` files -- NOT
from our generator -- so the scale-config tests hold our YAML against what the Collector's strict decoder
(``confmap``: ``ErrorUnused`` + ``WeaklyTypedInput: false``) and the components' ``Validate()`` accept.

Sources (repository @ release or commit, path):

* [core] open-telemetry/opentelemetry-collector @ v0.159.0 (commit 69c0873044e80fe1f0647a0bc5afec6244bcad76):
  confmap/internal/decoder.go (strict decoding: ``WeaklyTypedInput: false``, since v0.108.0, commit e477c3a348
  "Mark confmap.strictlyTypedInput as stable (#10793)"), exporter/otlpexporter/{metadata.yaml, config.go,
  config.schema.yaml}, exporter/exporterhelper/internal/config.schema.yaml (timeout),
  exporter/exporterhelper/internal/queuebatch/config.schema.yaml (sending_queue),
  config/configretry, config/configgrpc, config/configtls, config/confighttp, config/confignet
  (config.schema.yaml each), receiver/otlpreceiver/{metadata.yaml, config.schema.yaml},
  processor/batchprocessor/{metadata.yaml, config.schema.yaml}, otelcol/config.go and
  service/pipelines/config.go (top level, pipelines), service/internal/graph/graph.go (connector use).
* [releases] open-telemetry/opentelemetry-collector-releases @ v0.159.0:
  distributions/otelcol-contrib/manifest.yaml (every contrib component below is in the distribution).
* [contrib] open-telemetry/opentelemetry-collector-contrib. The whole repository could not be mirrored
  here; files were read at the commits named per component (mid-2026 versions from the v0.15x line).
  Release facts that these files do not show are taken from the merged pull requests named.

Schema language: a node is one of the scalar names below, ``obj(...)``, ``arr(node)``, ``mapof(node)``,
``OPAQUE`` (a mapping whose inside we never write, so it is not checked) or ``ANY``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

STRING, INTEGER, NUMBER, BOOLEAN, DURATION, ANY = "string", "integer", "number", "boolean", "duration", "any"


@dataclass(frozen=True)
class Obj:
    props: dict[str, Any]
    source: str = ""
    required: tuple[str, ...] = ()
    one_of: tuple[tuple[str, ...], ...] = ()  # exactly one key of each group must be present
    enums: dict[str, tuple[str, ...]] = field(default_factory=dict)  # allowed values of string fields


@dataclass(frozen=True)
class Arr:
    item: Any
    non_empty: bool = False


@dataclass(frozen=True)
class MapOf:
    value: Any


OPAQUE = "opaque"
Node = Union[str, Obj, Arr, MapOf]


def obj(props: dict[str, Any], source: str = "", **kw: Any) -> Obj:
    return Obj(props, source, **kw)


def merged(*parts: Obj, source: str = "", **kw: Any) -> Obj:
    """A struct that squashes others (``allOf`` in the schema files, ``mapstructure:",squash"`` in Go)."""
    props: dict[str, Any] = {}
    for p in parts:
        props.update(p.props)
    return Obj(props, source, **kw)


# -- core: shared config structs ([core] config/*/config.schema.yaml) ------------------------------------

TLS_COMMON = obj({k: STRING for k in ("ca_file", "ca_pem", "cert_file", "cert_pem", "key_file", "key_pem",
                                       "max_version", "min_version")}
                 | {"cipher_suites": Arr(STRING), "curve_preferences": Arr(STRING),
                    "include_system_ca_certs_pool": BOOLEAN, "reload_interval": DURATION, "tpm": OPAQUE},
                 "[core] config/configtls/config.schema.yaml $defs.config")
TLS_CLIENT = merged(TLS_COMMON, obj({"insecure": BOOLEAN, "insecure_skip_verify": BOOLEAN,
                                     "server_name_override": STRING}),
                    source="[core] config/configtls/config.schema.yaml $defs.client_config")
TLS_SERVER = merged(TLS_COMMON, obj({"client_ca_file": STRING, "client_ca_file_reload": BOOLEAN}),
                    source="[core] config/configtls/config.schema.yaml $defs.server_config")

GRPC_CLIENT = obj({"auth": OPAQUE, "authority": STRING, "balancer_name": STRING, "compression": STRING,
                   "endpoint": STRING, "headers": OPAQUE, "keepalive": OPAQUE, "middlewares": OPAQUE,
                   "read_buffer_size": INTEGER, "tls": TLS_CLIENT, "user_agent": STRING,
                   "wait_for_ready": BOOLEAN, "write_buffer_size": INTEGER},
                  "[core] config/configgrpc/config.schema.yaml $defs.client_config")
GRPC_SERVER = obj({"auth": OPAQUE, "include_metadata": BOOLEAN, "keepalive": OPAQUE,
                   "max_concurrent_streams": INTEGER, "max_recv_msg_size_mib": INTEGER, "middlewares": OPAQUE,
                   "read_buffer_size": INTEGER, "tls": TLS_SERVER, "write_buffer_size": INTEGER,
                   # confignet.addr_config (allOf)
                   "endpoint": STRING, "transport": STRING, "dialer": OPAQUE},
                  "[core] config/configgrpc/config.schema.yaml $defs.server_config + config/confignet addr_config")
HTTP_SERVER = obj({"auth": OPAQUE, "compression_algorithms": Arr(STRING), "cors": OPAQUE, "endpoint": STRING,
                   "idle_timeout": DURATION, "include_metadata": BOOLEAN, "keep_alives_enabled": BOOLEAN,
                   "max_request_body_size": INTEGER, "middlewares": OPAQUE, "read_header_timeout": DURATION,
                   "read_timeout": DURATION, "response_headers": OPAQUE, "tls": TLS_SERVER,
                   "write_timeout": DURATION},
                  "[core] config/confighttp/config.schema.yaml $defs.server_config")
RETRY = obj({"enabled": BOOLEAN, "initial_interval": DURATION, "max_elapsed_time": DURATION,
             "max_interval": DURATION, "multiplier": NUMBER, "randomization_factor": NUMBER},
            "[core] config/configretry/config.schema.yaml $defs.back_off_config")
QUEUE = obj({"batch": OPAQUE, "block_on_overflow": BOOLEAN, "enabled": BOOLEAN, "num_consumers": INTEGER,
             "queue_size": INTEGER, "sizer": STRING, "storage": STRING, "wait_for_result": BOOLEAN},
            "[core] exporter/exporterhelper/internal/queuebatch/config.schema.yaml $defs.config")
TIMEOUT = obj({"timeout": DURATION}, "[core] exporter/exporterhelper/internal/config.schema.yaml timeout_config")

# -- components -----------------------------------------------------------------------------------------

OTLP_RECEIVER = obj({"protocols": obj({
    "grpc": GRPC_SERVER,
    "http": merged(HTTP_SERVER, obj({"logs_url_path": STRING, "metrics_url_path": STRING,
                                     "traces_url_path": STRING})),
})}, "[core] receiver/otlpreceiver/config.schema.yaml")

BATCH_PROCESSOR = obj({"metadata_cardinality_limit": INTEGER, "metadata_keys": Arr(STRING),
                       "send_batch_max_size": INTEGER, "send_batch_size": INTEGER, "timeout": DURATION},
                      "[core] processor/batchprocessor/config.schema.yaml")

# otlpexporter.Config: TimeoutConfig (squash), sending_queue, retry_on_failure, configgrpc.ClientConfig (squash)
_OTLP_EXPORTER_FIELDS = merged(TIMEOUT, GRPC_CLIENT, obj({"sending_queue": QUEUE, "retry_on_failure": RETRY}))
OTLP_GRPC_EXPORTER = merged(_OTLP_EXPORTER_FIELDS, required=("endpoint",),
                            source="[core] exporter/otlpexporter/config.go (Validate: requires a non-empty "
                                   "\"endpoint\") + config.schema.yaml")

# [contrib] exporter/loadbalancingexporter/config.schema.yaml @ 0140961f9de290fdf809390d3153c1eb214a2300 and
# config.go (DNSResolver.Port is a string; read @ 870de3632d376a989b61459319e6e8754ec1532c too);
# loadbalancer.go (errNoResolver / errMultipleResolversProvided, read in the v0.101.0 tag's copy).
LB_RESOLVERS = ("static", "dns", "k8s", "aws_cloud_map")
LOAD_BALANCING_EXPORTER = merged(TIMEOUT, RETRY, obj({
    # protocol.otlp is an otlpexporter.Config; its endpoint is set per backend, so none is required here
    "protocol": obj({"otlp": _OTLP_EXPORTER_FIELDS}),
    "resolver": obj({
        "static": obj({"hostnames": Arr(STRING, non_empty=True)}, required=("hostnames",)),
        "dns": obj({"hostname": STRING, "port": STRING, "interval": DURATION, "timeout": DURATION},
                   required=("hostname",)),
        "k8s": obj({"service": STRING, "ports": Arr(INTEGER), "return_hostnames": BOOLEAN, "timeout": DURATION}),
        "aws_cloud_map": obj({"namespace": STRING, "service_name": STRING, "health_status": STRING,
                              "interval": DURATION, "timeout": DURATION, "port": INTEGER,
                              "owner_account": STRING}),
    }, one_of=(LB_RESOLVERS,)),
    "routing_key": STRING, "routing_attributes": Arr(STRING), "sending_queue": QUEUE,
}), source="[contrib] exporter/loadbalancingexporter/config.schema.yaml @ 0140961f",
    required=("resolver",),
    enums={"routing_key": ("traceID", "service", "resource", "metric", "streamID", "attributes")})

# [contrib] processor/tailsamplingprocessor/config.schema.yaml @ 048c7a088a874a1c282d390f36c24eb2290d3047
# (the newest of the stored versions read: it has sampling_strategy). Only the policy types we generate are
# spelled out; and/not/drop/composite are OPAQUE.
_POLICY_CONFIGS = {
    "latency": obj({"threshold_ms": INTEGER, "upper_threshold_ms": INTEGER}),
    "probabilistic": obj({"hash_salt": STRING, "sampling_percentage": NUMBER}),
    "status_code": obj({"status_codes": Arr(STRING, non_empty=True)}),
    "ottl_condition": obj({"error_mode": STRING, "span": Arr(STRING), "spanevent": Arr(STRING)},
                          enums={"error_mode": ("propagate", "ignore", "silent")}),
    "numeric_attribute": obj({"key": STRING, "min_value": INTEGER, "max_value": INTEGER, "invert_match": BOOLEAN}),
    "string_attribute": obj({"key": STRING, "values": Arr(STRING), "enabled_regex_matching": BOOLEAN,
                             "cache_max_size": INTEGER, "invert_match": BOOLEAN}),
    "boolean_attribute": obj({"key": STRING, "value": BOOLEAN, "invert_match": BOOLEAN}),
    "rate_limiting": obj({"spans_per_second": INTEGER}),
    "bytes_limiting": obj({"bytes_per_second": INTEGER, "burst_capacity": INTEGER}),
    "span_count": obj({"min_spans": INTEGER, "max_spans": INTEGER}),
    "trace_state": obj({"key": STRING, "values": Arr(STRING)}),
    "and": OPAQUE, "not": OPAQUE, "drop": OPAQUE, "composite": OPAQUE,
}
POLICY_TYPES = ("always_sample", *_POLICY_CONFIGS)
TAIL_SAMPLING_POLICY = obj({"name": STRING, "type": STRING, "ExtensionCfg": OPAQUE, **_POLICY_CONFIGS},
                           "[contrib] tailsamplingprocessor config.schema.yaml $defs.policy_cfg",
                           required=("name", "type"), enums={"type": POLICY_TYPES})
TAIL_SAMPLING_PROCESSOR = obj({
    "block_on_overflow": BOOLEAN,
    "decision_cache": obj({"non_sampled_cache_size": INTEGER, "sampled_cache_size": INTEGER}),
    "decision_wait": DURATION, "decision_wait_after_root_received": DURATION,
    "drop_pending_traces_on_shutdown": BOOLEAN, "expected_new_traces_per_sec": INTEGER,
    "maximum_trace_size_bytes": INTEGER, "num_traces": INTEGER,
    "policies": Arr(TAIL_SAMPLING_POLICY, non_empty=True), "sample_on_first_match": BOOLEAN,
    "sampling_strategy": STRING,
}, "[contrib] processor/tailsamplingprocessor/config.schema.yaml @ 048c7a08",
    enums={"sampling_strategy": ("trace-complete", "span-ingest")})

# [contrib] connector/signaltometricsconnector: config/config.go @ 8dfdf20f0fa3571fe4302ba0cf7db7719329d4b9
# (validateMetricInfo: name required, exactly one metric type, histogram/sum value required) and
# config/config.schema.yaml @ c11b98b9 (adds error_mode) and @ 14c63937 (adds sum.monotonic). Both keys are
# newer than the connector: error_mode from PR #46005 (merged Feb 2026), sum.monotonic from PR #45865
# (merged Mar 2026). A connector built before them does not know the keys (see _legacy() below).
_S2M_ATTRIBUTE = obj({"key": STRING, "default_value": ANY, "optional": BOOLEAN}, required=("key",))
_S2M_METRIC = obj({
    "name": STRING, "description": STRING, "unit": STRING, "conditions": Arr(STRING),
    "attributes": Arr(_S2M_ATTRIBUTE), "include_resource_attributes": Arr(_S2M_ATTRIBUTE),
    "histogram": obj({"buckets": Arr(NUMBER), "count": STRING, "value": STRING}, required=("value",)),
    "exponential_histogram": obj({"max_size": INTEGER, "count": STRING, "value": STRING}, required=("value",)),
    "sum": obj({"value": STRING, "monotonic": BOOLEAN}, required=("value",)),
    "gauge": obj({"value": STRING}, required=("value",)),
}, "[contrib] signaltometricsconnector config.schema.yaml $defs.metric_info", required=("name",),
    one_of=(("histogram", "exponential_histogram", "sum", "gauge"),))
SIGNAL_TO_METRICS_CONNECTOR = obj({
    "spans": Arr(_S2M_METRIC), "datapoints": Arr(_S2M_METRIC), "logs": Arr(_S2M_METRIC),
    "profiles": Arr(_S2M_METRIC), "error_mode": STRING,
}, "[contrib] signaltometricsconnector config.schema.yaml $defs.config",
    enums={"error_mode": ("propagate", "ignore", "silent")})

# [contrib] processor/deltatocumulativeprocessor/config.go @ 07cf7acde6de25ac49a43874880a9c3107ddf425
# (Validate: max_stale must be a positive duration, max_streams >= 0)
DELTA_TO_CUMULATIVE_PROCESSOR = obj({"max_stale": DURATION, "max_streams": INTEGER, "storage": STRING},
                                    "[contrib] processor/deltatocumulativeprocessor/config.go @ 07cf7acd")

# [contrib] exporter/prometheusexporter/config.schema.yaml @ 31032946ad82039f1b1adcccdc06ad7524dcff85
PROMETHEUS_EXPORTER = merged(HTTP_SERVER, obj({
    "add_metric_suffixes": BOOLEAN, "const_labels": OPAQUE, "enable_open_metrics": BOOLEAN,
    "metric_expiration": DURATION, "namespace": STRING, "resource_constant_labels": OPAQUE,
    "resource_to_telemetry_conversion": OPAQUE, "send_timestamps": BOOLEAN, "sending_queue": QUEUE,
    "translation_strategy": STRING, "without_scope_info": BOOLEAN,
}), source="[contrib] exporter/prometheusexporter/config.schema.yaml @ 31032946")


@dataclass(frozen=True)
class Component:
    kind: str                       # receiver / processor / exporter / connector
    schema: Node
    signals: tuple[str, ...] = ()   # pipelines it may sit in (receivers, processors, exporters)
    connects: tuple[tuple[str, str], ...] = ()  # connectors: (exporter pipeline signal, receiver pipeline signal)


@dataclass(frozen=True)
class Release:
    """The component types one release line registers, by kind: current names and deprecated aliases."""

    name: str
    components: dict[tuple[str, str], Component]  # (kind, type) -> component
    deprecated: frozenset[tuple[str, str]] = frozenset()


_ALL = ("traces", "metrics", "logs")
_BASE = {
    # [core] receiver/otlpreceiver/metadata.yaml: type otlp
    ("receiver", "otlp"): Component("receiver", OTLP_RECEIVER, _ALL),
    # [core] processor/batchprocessor/metadata.yaml: type batch
    ("processor", "batch"): Component("processor", BATCH_PROCESSOR, _ALL),
    # [contrib] tailsamplingprocessor metadata.yaml: type tail_sampling, traces only
    ("processor", "tail_sampling"): Component("processor", TAIL_SAMPLING_PROCESSOR, ("traces",)),
    # [contrib] prometheusexporter metadata.yaml: type prometheus, metrics only
    ("exporter", "prometheus"): Component("exporter", PROMETHEUS_EXPORTER, ("metrics",)),
}
_RENAMED = {
    # (kind, new type, old type, component). Sources:
    # [core] exporter/otlpexporter/metadata.yaml @ v0.159.0: "type: otlp_grpc, deprecated_type: otlp"
    #   (renamed in core v0.144.0, commit fc5681aa "rename to otlp_grpc with deprecated alias otlp (#14403)").
    # load_balancing: the exporter's README as published for v0.154.0 ("renamed from loadbalancing to
    #   load_balancing ... The old name loadbalancing is preserved as a deprecated alias").
    # signal_to_metrics: contrib PR #45714 "[connector/signaltometrics] Rename signaltometrics to
    #   signal_to_metrics" (approved 2026-02-05, merged).
    # delta_to_cumulative: contrib PR #49634 "Rename deltatocumulative to delta_to_cumulative with
    #   deprecated alias deltatocumulative" (ready to merge 2026-07-30, merged before v0.159.0 was cut).
    "otlp_grpc": ("exporter", "otlp", Component("exporter", OTLP_GRPC_EXPORTER, _ALL)),
    "load_balancing": ("exporter", "loadbalancing",
                       # [contrib] loadbalancingexporter metadata: beta traces, logs; development metrics
                       Component("exporter", LOAD_BALANCING_EXPORTER, _ALL)),
    "signal_to_metrics": ("connector", "signaltometrics",
                          # README: traces->metrics, logs->metrics, metrics->metrics (+ profiles)
                          Component("connector", SIGNAL_TO_METRICS_CONNECTOR,
                                    connects=(("traces", "metrics"), ("logs", "metrics"),
                                              ("metrics", "metrics")))),
    "delta_to_cumulative": ("processor", "deltatocumulative",
                            Component("processor", DELTA_TO_CUMULATIVE_PROCESSOR, ("metrics",))),
}


def _v0_159() -> Release:
    comps = dict(_BASE)
    deprecated = set()
    for new, (kind, old, comp) in _RENAMED.items():
        comps[(kind, new)] = comp
        comps[(kind, old)] = comp
        deprecated.add((kind, old))
    return Release("v0.159", comps, frozenset(deprecated))


# The connector as released before the renames: neither error_mode nor sum.monotonic (both PRs came later;
# config.go @ 8dfdf20f shows the struct without them). That version decodes with WithIgnoreUnused, so it
# would not even complain about them -- it would silently not do what they ask; the legacy files omit them.
_S2M_METRIC_LEGACY = Obj({**_S2M_METRIC.props, "sum": obj({"value": STRING}, required=("value",))},
                         _S2M_METRIC.source + " (before PR #45865)", _S2M_METRIC.required, _S2M_METRIC.one_of)
SIGNAL_TO_METRICS_CONNECTOR_LEGACY = obj({k: Arr(_S2M_METRIC_LEGACY) for k in ("spans", "datapoints", "logs")},
                                         "[contrib] signaltometricsconnector config/config.go @ 8dfdf20f")


# tail_sampling before contrib PR #44878 (Dec 2025) had no decision_wait_after_root_received
TAIL_SAMPLING_PROCESSOR_LEGACY = Obj({k: v for k, v in TAIL_SAMPLING_PROCESSOR.props.items()
                                      if k not in ("decision_wait_after_root_received", "sampling_strategy")},
                                     TAIL_SAMPLING_PROCESSOR.source + " (before PRs #44878, #46762)")


def _legacy() -> Release:
    comps = dict(_BASE)
    comps[("processor", "tail_sampling")] = Component("processor", TAIL_SAMPLING_PROCESSOR_LEGACY, ("traces",))
    for _new, (kind, old, comp) in _RENAMED.items():
        comps[(kind, old)] = comp
    s2m = comps[("connector", "signaltometrics")]
    comps[("connector", "signaltometrics")] = Component("connector", SIGNAL_TO_METRICS_CONNECTOR_LEGACY,
                                                        connects=s2m.connects)
    return Release("legacy", comps)


RELEASES = {"v0.159": _v0_159(), "legacy": _legacy()}
