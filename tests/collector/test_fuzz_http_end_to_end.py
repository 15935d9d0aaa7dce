"""Hypothesis on the HTTP path end to end: random bytes and odd-but-valid OTLP (protobuf and JSON, some
gzipped), each followed or accompanied by a valid span. Invariant: never a 5xx, the gateway never stops
serving, and every valid span sent alongside reaches the exporter."""

from __future__ import annotations

import gzip
import http.client
import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector_testkit import export_request, loopback_config, span
from otel_llm.otlp.json_codec import dumps
from otel_llm_collector.gateway import Gateway
from test_bad_input import odd_requests

_ids = itertools.count(1 << 100)  # valid trace ids, far from what the odd requests draw
SENT: list[int] = []


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz") / "out.jsonl"
    g = Gateway(loopback_config(processors={"tail_sampling": None}, exporters={"file": {"path": str(out)}}),
                manual_ticks=True).start()
    yield g
    assert g.flush(30)
    exported = {int(s["traceId"], 16) for line in out.read_text().splitlines()
                for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]}
    g.shutdown()
    missing = [t for t in SENT if t not in exported]
    assert not missing, f"{len(missing)} valid spans sent alongside odd input were lost"


def post(g: Gateway, body: bytes, ctype: str, gz: bool) -> tuple[int, bytes]:
    headers = {"Content-Type": ctype}
    if gz:
        body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
    conn = http.client.HTTPConnection("127.0.0.1", g.http.port, timeout=30)
    try:
        conn.request("POST", "/v1/traces", body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def valid_span() -> tuple[int, object]:
    tid = next(_ids)
    SENT.append(tid)
    return tid, span(tid, 1)


SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
CTYPES = st.sampled_from(["application/x-protobuf", "application/json"])


@SETTINGS
@given(body=st.binary(max_size=3000), ctype=CTYPES, gz=st.booleans())
def test_random_bytes_then_a_valid_export(gw: Gateway, body: bytes, ctype: str, gz: bool) -> None:
    status, _ = post(gw, body, ctype, gz)
    assert status < 500 and status in (200, 400, 413)
    _, good = valid_span()
    status, _ = post(gw, export_request(good).SerializeToString(), "application/x-protobuf", False)
    assert status == 200


@SETTINGS
@given(req=odd_requests(), as_json=st.booleans(), gz=st.booleans())
def test_odd_otlp_with_a_valid_span_inside(gw: Gateway, req, as_json: bool, gz: bool) -> None:
    _, good = valid_span()
    req.resource_spans[0].scope_spans[0].spans.append(good)  # the valid span travels with the odd ones
    body = dumps(req).encode() if as_json else req.SerializeToString()
    status, _ = post(gw, body, "application/json" if as_json else "application/x-protobuf", gz)
    assert status == 200
