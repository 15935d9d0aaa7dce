"""A disaggregated user request judged and counted from both halves at the gateway.

The spans are built like P's and D's: P's request span (one output token, ``llm.disagg.role=prefill``, its own
verdict) and D's (``llm.disagg.role=decode``), each under the router's hop span, in one trace. What is
asserted is what the gateway decides: the user's request (P's whole request, then D's) breaches an objective
neither half breaches alone, the trace is kept whole, the breach is charged to P's queueing, and the goodput
counters count each user request once."""

from __future__ import annotations

from collector_testkit import FakeClock, export_request, loopback_config, request_attrs, span
from otel_llm_collector.gateway import Gateway
from otel_llm_collector.spans import extract, spans_of

from otel_llm import semconv as sc
from otel_llm.core.disagg import USER, join, pair, user_requests, verdict
from otel_llm.core.metrics import GOOD_REQUESTS, REQUESTS, SLO_BREACHES
from otel_llm.core.summary import RequestSummary
from support.metrics import points_by_name

SLO = "ttft=2.35,tpot=0.05"
CLIENT, ROUTER, HOP_P, HOP_D, P_SPAN, D_SPAN = 1, 2, 3, 4, 5, 6


def _halves(trace: int, p_queue: float, p_e2e: float, d_ttft: float, p_cause: str | None = None,
            d_cause: str | None = None) -> tuple:
    p = request_attrs(ttft=p_e2e, tpot=None, e2e=p_e2e, **{sc.LATENCY_QUEUE: p_queue, sc.USAGE_OUTPUT_TOKENS: 1,
                                                          sc.DISAGG_ROLE: sc.DISAGG_ROLE_PREFILL})
    del p[sc.LATENCY_TPOT]
    d = request_attrs(ttft=d_ttft, tpot=0.01, e2e=d_ttft + 0.2, **{sc.LATENCY_QUEUE: 0.01,
                                                                  sc.DISAGG_ROLE: sc.DISAGG_ROLE_DECODE})
    if p_cause:
        p[sc.SLOW_CAUSE] = p_cause
    if d_cause:
        d[sc.SLOW_CAUSE] = d_cause
    return (span(trace, P_SPAN, parent=HOP_P, name="chat m", attrs=p),
            span(trace, D_SPAN, parent=HOP_D, name="chat m", attrs=d))


def _router(trace: int) -> list:
    return [span(trace, CLIENT, name="chat m"), span(trace, ROUTER, parent=CLIENT, name="router"),
            span(trace, HOP_P, parent=ROUTER, name="prefill"), span(trace, HOP_D, parent=ROUTER, name="decode")]


def _gateway(clock: FakeClock) -> tuple[Gateway, list]:
    kept: list = []
    g = Gateway(loopback_config(processors={
        "llm_metrics": {"slo": SLO},
        "tail_sampling": {"decision_wait": "30s", "decision_wait_after_root_received": "5s",
                          "policies": [{"name": "slo_breach", "type": "slo"}]}}), clock=clock, manual_ticks=True)
    g._emit = lambda items: kept.extend(items)  # the kept spans, as the exporters would get them
    if g.sampler is not None:
        g.sampler._emit = g._emit
    return g, kept


def _counter(g: Gateway, name: str) -> dict:
    out: dict = {}
    for p in points_by_name(g.metric_reader.get_metrics_data()).get(name, []):
        a = dict(p.attributes)
        key = (a.get(sc.DISAGG_ROLE), a.get(sc.SLO_OBJECTIVE), a.get(sc.SLOW_CAUSE))
        out[key] = out.get(key, 0) + p.value
    return out


def test_the_users_ttft_breach_is_judged_from_both_halves_and_charged_to_ps_queue():
    clock = FakeClock()
    g, kept = _gateway(clock)
    slow, quiet = 0xD1, 0xD2
    # P queued 2 s (its own verdict: max_num_seqs held it); neither half breaches ttft=2.35 alone
    p_slow, d_slow = _halves(slow, p_queue=2.0, p_e2e=2.3, d_ttft=0.1, p_cause=sc.SLOW_QUEUE_MAX_SEQS)
    p_quiet, d_quiet = _halves(quiet, p_queue=0.01, p_e2e=0.3, d_ttft=0.1)
    # P's half arrives first (it finished first), D's with the router's and client's spans later
    g.ingest(export_request(p_slow, p_quiet, service="vllm-prefill"))
    g.ingest(export_request(d_slow, d_quiet, service="vllm-decode"))
    g.ingest(export_request(*_router(slow), *_router(quiet), service="router"))
    clock.advance(31)
    g.tick()
    kept_traces: dict[int, set[int]] = {}
    for s in spans_of(kept):
        kept_traces.setdefault(int.from_bytes(s.trace_id, "big"), set()).add(int.from_bytes(s.span_id, "big"))
    # the slow user request is kept whole (both halves, the router's hops, the client), the quiet one dropped
    assert kept_traces == {slow: {CLIENT, ROUTER, HOP_P, HOP_D, P_SPAN, D_SPAN}}
    # the breach is the user's, charged to the prefill half's queueing
    t = g.telemetry
    assert t.value("disagg_user_breaches", objective="ttft", side=sc.DISAGG_ROLE_PREFILL,
                   cause=sc.SLOW_QUEUE_MAX_SEQS) == 1
    assert t.value("disagg_join_joined") == 2
    breaches = _counter(g, SLO_BREACHES)
    assert breaches == {(USER, "ttft", sc.SLOW_QUEUE_MAX_SEQS): 1}  # no half breached on its own
    # goodput counts each user request once: the joined one, never a half
    assert _counter(g, REQUESTS) == {(USER, None, None): 2}
    assert _counter(g, GOOD_REQUESTS) == {(USER, None, None): 1}
    # the halves keep their own latency series, by role
    ttft_roles = {dict(p.attributes).get(sc.DISAGG_ROLE)
                  for p in points_by_name(g.metric_reader.get_metrics_data())["gen_ai.server.time_to_first_token"]}
    assert ttft_roles == {sc.DISAGG_ROLE_PREFILL, sc.DISAGG_ROLE_DECODE, USER}


def test_a_decode_half_whose_prefill_half_never_came_is_the_user_request_alone():
    clock = FakeClock()
    g, _ = _gateway(clock)
    _, d = _halves(0xD3, p_queue=0.01, p_e2e=0.3, d_ttft=0.1)
    g.ingest(export_request(d, service="vllm-decode"))
    assert _counter(g, REQUESTS) == {}  # waiting for its partner
    clock.advance(61)
    g.ingest(export_request(span(0xD4, 1, name="other"), service="app"))  # a later batch settles it
    assert _counter(g, REQUESTS) == {(USER, None, None): 1}
    assert g.telemetry.value("disagg_join_forgotten") == 1


def _summary(role: str, **kw) -> RequestSummary:
    return RequestSummary(model="m", disagg_role=role, **kw)


def test_the_user_request_adds_the_halves_up_and_the_verdict_weighs_their_causes():
    p = _summary(sc.DISAGG_ROLE_PREFILL, ttft=1.5, e2e=1.5, queue=0.1, prefill=1.4, output_tokens=1,
                 input_tokens=70)
    d = _summary(sc.DISAGG_ROLE_DECODE, ttft=1.0, tpot=0.01, e2e=1.5, queue=0.05, decode=0.5, output_tokens=51,
                 input_tokens=70, slow_cause=sc.SLOW_KV_TRANSFER)
    user = join(p, d)
    assert (user.ttft, user.e2e, user.tpot, user.output_tokens) == (2.5, 3.0, 0.01, 51)
    assert user.disagg_role == USER and pair([d, p]) == (p, d)
    # D's slow load is the only named cause: the breach is D's
    assert verdict(p, d, ("ttft",)) == (sc.DISAGG_ROLE_DECODE, sc.SLOW_KV_TRANSFER)
    # P's queueing weighs more when P queued longer than D's whole time to first token
    p.slow_cause, p.queue = sc.SLOW_QUEUE_KV_CACHE, 1.2
    assert verdict(p, d, ("ttft",)) == (sc.DISAGG_ROLE_PREFILL, sc.SLOW_QUEUE_KV_CACHE)
    # a TPOT breach happened on D only: P's causes are not candidates
    d.slow_cause = sc.SLOW_BATCH_GROWTH
    assert verdict(p, d, ("tpot",)) == (sc.DISAGG_ROLE_DECODE, sc.SLOW_BATCH_GROWTH)
    d.slow_cause = None
    assert verdict(p, d, ("tpot",)) == (None, sc.SLOW_UNKNOWN)
    # not a pair: as they are
    alone = [d]
    assert user_requests(alone) is alone and user_requests([p, d])[0].disagg_role == USER


def test_extract_reads_the_role():
    p, _ = _halves(0xD5, p_queue=0.01, p_e2e=0.3, d_ttft=0.1)
    (r,) = extract(export_request(p)).requests
    assert r.summary.disagg_role == sc.DISAGG_ROLE_PREFILL


def test_the_user_request_carries_a_halfs_tenant_and_is_judged_by_its_scope():
    clock = FakeClock()
    kept: list = []
    g = Gateway(loopback_config(processors={"llm_metrics": {"slo": "tpot=0.05; @team-a: tpot=0.005"}}),
                clock=clock, manual_ticks=True)
    g._emit = lambda items: kept.extend(items)
    spans = []
    for trace, p_tenant, d_tenant in ((0xE1, "team-a", None), (0xE2, None, "team-a"), (0xE3, "team-a", "team-b"),
                                      (0xE4, None, None)):
        p, d = _halves(trace, p_queue=0.01, p_e2e=0.3, d_ttft=0.1)  # D's tpot 0.01: team-a's scope breaches
        for s, tenant in ((p, p_tenant), (d, d_tenant)):
            if tenant is not None:
                s.attributes.add(key=sc.REQUEST_TENANT).value.string_value = tenant
        spans += [p, d]
    g.ingest(export_request(*spans, service="vllm"))
    users = {}
    for pt in points_by_name(g.metric_reader.get_metrics_data())[REQUESTS]:
        a = dict(pt.attributes)
        if a.get(sc.DISAGG_ROLE) == USER:
            users[a.get(sc.REQUEST_TENANT)] = users.get(a.get(sc.REQUEST_TENANT), 0) + pt.value
    assert users == {"team-a": 3, None: 1}  # P's tenant first, else D's
    # team-a's scope (tpot=0.005) judged its three; the default (tpot=0.05) passed the tenantless one
    assert g.telemetry.value("disagg_user_breaches", objective="tpot", side=sc.SLOW_UNKNOWN,
                             cause=sc.SLOW_UNKNOWN) == 3
    assert sum(v for (role, objective, _), v in _counter(g, SLO_BREACHES).items()
               if role == USER and objective == "tpot") == 3


def test_join_takes_the_prefill_halfs_tenant_else_the_decode_halfs():
    p = _summary(sc.DISAGG_ROLE_PREFILL, ttft=0.3, e2e=0.3, output_tokens=1, tenant="team-a")
    d = _summary(sc.DISAGG_ROLE_DECODE, ttft=0.1, tpot=0.01, e2e=0.3, output_tokens=9, tenant="team-b")
    assert join(p, d).tenant == "team-a"
    p.tenant = None
    assert join(p, d).tenant == "team-b"
    d.tenant = None
    assert join(p, d).tenant is None
