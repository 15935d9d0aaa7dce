"""The one place that speaks OTLP, for the SDK side and the collector alike.

    encode          OTLP trace protobuf written byte by byte (spans, attributes, links, the request frame)
    view            reading received export requests without copying spans (the collector's receive path)
    json_codec      OTLP/JSON <-> protobuf, with the spec's hex ids
    file            OTLP/JSON lines files (the SDK-side span exporter; the collector's file exporter)
    messages        the OTLP trace service's requests, responses and error bodies (receivers, senders)
    direct_export   spans we encoded, sent with the tracer provider's own OTLP exporters
    wire_tracer     a tracer that writes its spans as OTLP bytes for direct_export
    routes          how the SDK side hands spans to export, chosen once per provider inspection
    sdk_bridge      every private opentelemetry-sdk name we read, fenced in one module

Nothing here is imported by ``import otel_llm``; each module imports only what it needs.
"""
