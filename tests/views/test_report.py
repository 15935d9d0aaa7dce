"""The timeline report from recorded spans of a real demo run (tests/views/data/demo-slice.jsonl: the three
slowest request traces of a run on the CPU engine, two fast ones, and the engine steps linked to them)."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import jsonschema
import pytest

from otel_llm import semconv as sc
from otel_llm.views import chrome_trace
from otel_llm.views.cli import main
from otel_llm.views.report import write_report
from otel_llm.views.timeline import STALL_FACTOR, build, features
from otel_llm.views.traces import TraceFileError, read_spans

DATA = Path(__file__).parent / "data"
SLICE = DATA / "demo-slice.jsonl"
SCHEMA = json.loads((DATA / "trace_event_format.schema.json").read_text())


@pytest.fixture(scope="module")
def spans():
    return read_spans(SLICE)


def test_lanes_are_the_slowest_requests_with_their_phases_and_the_steps_they_shared(spans) -> None:
    t = build(spans, top=3)
    requests = sorted((s for s in spans if sc.LATENCY_E2E in s.attributes), key=lambda s: -s.attributes[sc.LATENCY_E2E])
    assert [lane.key for lane in t.requests] == [r.span_id for r in requests[:3]]
    for lane, r in zip(t.requests, requests):
        kinds = [seg.kind for seg in lane.segments]
        assert {"queue", "prefill", "decode", "chunk"} <= set(kinds), kinds
        # the phase bars are the request's own child spans
        phases = {seg.kind: seg for seg in lane.segments if seg.kind in ("queue", "prefill", "decode")}
        children = {c.name: c for c in r.children}
        assert phases["decode"].start_ns == children[sc.SPAN_DECODE].start_ns
        assert phases["queue"].end_ns == children[sc.SPAN_QUEUE].end_ns
        assert lane.title == r.attributes[sc.RESPONSE_ID]
    # the engine lane holds exactly the steps linked to the drawn requests, coloured by their phase
    drawn = {lane.key for lane in t.requests}
    linked = [s for s in spans if s.name == sc.SPAN_ENGINE_STEP and any(link.span_id in drawn for link in s.links)]
    (engine,) = t.engines
    assert len(engine.segments) == len(linked) > 0
    by_id = {s.attributes[sc.ENGINE_STEP_ID]: s for s in linked}
    for seg in engine.segments:
        assert seg.kind == "step-" + by_id[seg.step_id].attributes[sc.STEP_PHASE]
    assert {seg.kind for seg in engine.segments} >= {"step-mixed", "step-decode"}


def test_stalls_are_decode_steps_well_over_the_requests_median_gap(spans) -> None:
    t = build(spans, top=3)
    by_id = {s.span_id: s for s in spans}
    total = 0
    for lane in t.requests:
        decode = next(c for c in by_id[lane.key].children if c.name == sc.SPAN_DECODE)
        gaps = {c.attributes[sc.STEP_INDEX]: c.end_ns - c.start_ns for c in decode.children
                if c.name == sc.SPAN_DECODE_STEP}
        median = statistics.median_low(gaps.values())
        stalls = {seg.args["token"] for seg in lane.segments if seg.kind == "stall"}
        assert stalls == {i for i, g in gaps.items() if g > STALL_FACTOR * median and g > 1e6}
        total += len(stalls)
    assert total > 0  # the slowest requests of this run were stalled by long prefills


def test_chrome_trace_matches_the_trace_event_format_schema(spans) -> None:
    doc = json.loads(chrome_trace.dumps(build(spans, top=3)))
    jsonschema.validate(doc, SCHEMA, cls=jsonschema.Draft202012Validator)
    events = doc["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")}
    assert {"slowest requests", "engine steps"} <= names
    complete = [e for e in events if e["ph"] == "X"]
    assert {e["cat"].split(",")[1] for e in complete} >= {"queue", "prefill", "decode", "stall", "step-mixed"}
    assert all(e["dur"] >= 0 for e in complete)
    # chunks point at the engine step that computed them (flow events), inside both slices
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts and starts.keys() == finishes.keys()
    for ident, s in starts.items():
        f = finishes[ident]
        assert any(e["pid"] == s["pid"] and e["tid"] == s["tid"] and e["ts"] <= s["ts"] <= e["ts"] + e["dur"]
                   and e["cat"].endswith((",chunk", ",stall")) for e in complete)
        assert any(e["pid"] == f["pid"] and e["tid"] == f["tid"] and e["ts"] <= f["ts"] <= e["ts"] + e["dur"]
                   and e["cat"].startswith("engine_step") for e in complete)


def test_the_schema_can_fail() -> None:
    bad = [{"traceEvents": [{"ph": "X", "name": "x", "ts": 1, "pid": 1, "tid": 1}]},  # no dur
           {"traceEvents": [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {}}]},  # no args.name
           {"traceEvents": [{"ph": "Q", "name": "x", "ts": 1, "pid": 1, "tid": 1}]},  # no such phase
           {"traceEvents": [{"ph": "b", "name": "x", "ts": 1, "pid": 1, "tid": 1}]},  # async without id
           {"traceEvents": [], "displayTimeUnit": "s"}]
    for doc in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, SCHEMA, cls=jsonschema.Draft202012Validator)


def test_html_is_self_contained(tmp_path: Path) -> None:
    written = write_report(SLICE, tmp_path / "r.html", tmp_path / "r.json", top=3)
    page = written.html.read_text()
    # nothing to fetch: no external scripts, styles, images, fonts or imports
    assert not re.search(r"""\b(src|href)\s*=|url\(|@import|<link\b""", page, re.I)
    assert re.findall(r"https?://[^\"' <]+", page) == ["http://www.w3.org/2000/svg"]  # a namespace name, not a fetch
    assert page.count('class="lane request"') == 3 and page.count('class="lane engine"') == 1


def test_cli_writes_both_and_reports_bad_input(tmp_path: Path, capsys) -> None:
    assert main(["report", str(SLICE), "-o", str(tmp_path / "a.html"), "--perfetto", str(tmp_path / "a.json")]) == 0
    assert (tmp_path / "a.html").exists() and json.loads((tmp_path / "a.json").read_text())["traceEvents"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(SLICE.read_text().splitlines()[0] + "\n{not json\n")
    with pytest.raises(TraceFileError, match=r"bad.jsonl:2: malformed JSON"):
        read_spans(bad)
    assert main(["report", str(bad)]) == 1
    assert "bad.jsonl:2" in capsys.readouterr().err and not (tmp_path / "bad.html").exists()
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 1


def test_a_file_without_requests_says_so(tmp_path: Path) -> None:
    steps_only = tmp_path / "steps.jsonl"
    lines = [line for line in SLICE.read_text().splitlines() if sc.LATENCY_E2E not in line]
    steps_only.write_text("\n".join(lines) + "\n")
    written = write_report(steps_only, tmp_path / "s.html")
    assert written.timeline.requests == [] and "No request spans in this file" in written.html.read_text()


def test_stalls_with_decode_windows_use_the_token_weighted_median() -> None:
    from otel_llm.views.timeline import STEP_FACTS_PREFIX, SPAN_DECODE_WINDOW, WINDOW_TOKENS, median_gap_ns
    from otel_llm.views.traces import Span

    def span(name, start_ms, end_ms, parent="", sid="", **attrs):
        return Span("t" * 32, sid or f"{name}{start_ms}", parent, name, int(start_ms * 1e6), int(end_ms * 1e6),
                    attrs, "svc")

    request = span("chat m", 0, 1200, sid="r", **{sc.LATENCY_E2E: 1.2, sc.RESPONSE_ID: "r1"})
    decode = span(sc.SPAN_DECODE, 0, 1200, parent="r", sid="d")
    children = [span(SPAN_DECODE_WINDOW, 0, 1000, parent="d", **{WINDOW_TOKENS: 100}),  # 100 gaps of 10 ms
                span(sc.SPAN_DECODE_STEP, 1000, 1050, parent="d",  # a 50 ms stall, with its engine step's facts
                     **{sc.STEP_INDEX: 101, sc.ENGINE_STEP_ID: 7, STEP_FACTS_PREFIX + "other_prefill_tokens": 512}),
                span(sc.SPAN_DECODE_STEP, 1050, 1062, parent="d", **{sc.STEP_INDEX: 102})]  # 12 ms: not one
    t = build([request, decode, *children], top=1)
    assert median_gap_ns(decode) == 10e6
    (stall,) = [seg for seg in t.requests[0].segments if seg.kind == "stall"]
    assert stall.args["token"] == 101 and stall.step_id == 7 and stall.args["other_prefill_tokens"] == 512


def _judged_requests():
    from otel_llm.views.traces import Span

    def request(rid: str, e2e: float, cause: str, breached: tuple[str, ...], **attrs):
        return Span("t" * 32, rid, "", "chat m", 0, int(e2e * 1e9),
                    {sc.LATENCY_E2E: e2e, sc.RESPONSE_ID: rid, sc.SLOW_CAUSE: cause, sc.SLO_BREACHED: breached,
                     sc.SLOW_SECONDS[cause]: 0.4, **attrs}, "svc")

    return [request("slow-queue", 3.0, sc.SLOW_QUEUE_MAX_SEQS, ("ttft",), **{sc.LATENCY_TTFT: 2.5}),
            request("slow-prefill", 2.0, sc.SLOW_PREFILL_INTERFERENCE, ("tpot",), **{sc.LATENCY_TPOT: 0.0612}),
            request("slow-both", 1.0, sc.SLOW_PREFILL_INTERFERENCE, ("ttft", "tpot"))]


def test_selection_by_cause_and_breached_objective() -> None:
    from otel_llm.views.timeline import Selection

    spans = _judged_requests()
    pick = lambda **kw: [lane.title for lane in build(spans, select=Selection(**kw)).requests]  # noqa: E731
    assert pick() == ["slow-queue", "slow-prefill", "slow-both"]
    assert pick(cause=sc.SLOW_PREFILL_INTERFERENCE) == ["slow-prefill", "slow-both"]
    assert pick(breached="ttft") == ["slow-queue", "slow-both"]
    assert pick(cause=sc.SLOW_PREFILL_INTERFERENCE, breached="ttft", top=1) == ["slow-both"]
    for bad in (dict(top=0), dict(top=-3), dict(cause="slowness"), dict(breached="latency")):
        with pytest.raises(ValueError):
            Selection(**bad)


def test_each_lane_carries_its_verdict_with_seconds_and_the_breached_slo() -> None:
    lanes = build(_judged_requests(), slo={"tpot": 0.03}).requests
    assert lanes[0].verdict == "why: queue_max_seqs (queue_max_seqs 400 ms); breached ttft 2.50 s"
    assert lanes[1].verdict == ("why: prefill_interference (prefill_interference 400 ms); "
                                "breached tpot 61 ms > SLO 30 ms")
    assert lanes[1].cause == sc.SLOW_PREFILL_INTERFERENCE


def test_a_lane_shows_the_slo_its_request_span_was_judged_against() -> None:
    """The request span's own thresholds (``llm.slo.<objective>``: per model, per demo phase) win over
    the report's ``--slo``; without them, the report's is shown."""
    spans = _judged_requests()
    spans[0].attributes[sc.SLO_THRESHOLDS["ttft"]] = 0.25
    spans[1].attributes[sc.SLO_THRESHOLDS["tpot"]] = 0.045
    lanes = build(spans, slo={"tpot": 0.03, "ttft": 1.0}).requests
    assert lanes[0].verdict.endswith("breached ttft 2.50 s > SLO 250 ms")
    assert lanes[1].verdict.endswith("breached tpot 61 ms > SLO 45 ms")


def test_tooltips_have_units_and_a_readable_precision() -> None:
    from otel_llm.views.html import _arg

    assert _arg("duration_ms", 0.8867817000000286) == "duration 0.887 ms"
    assert _arg("duration_ms", 1234.5678) == "duration 1235 ms"
    assert _arg("kv_cache_usage", 0.4213) == "KV cache 42%"
    assert _arg("prefill_tokens", 512) == "prefill 512 tokens"
    assert _arg("other_prefill_tokens", 512) == "other prefill tokens 512"


def test_cli_rejects_a_bad_selection_before_writing(tmp_path: Path, capsys) -> None:
    for args in (["--top", "0"], ["--top", "-3"], ["--top", "x"], ["--cause", "slowness"], ["--breached", "nope"],
                 ["--slo", "ttft=fast"]):
        with pytest.raises(SystemExit) as exc:
            main(["report", str(SLICE), "-o", str(tmp_path / "x.html"), *args])
        assert exc.value.code == 2, args
        assert "otel-llm report: error: argument" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()
    assert main(["report", str(SLICE), "-o", str(tmp_path / "y.html"), "--cause", "preemption"]) == 0
    assert "0 slowest of 5 requests (verdict preemption)" in capsys.readouterr().out
    assert "No request in this file matches" in (tmp_path / "y.html").read_text()


def test_a_lane_names_its_adapter_and_speculative_acceptance(tmp_path: Path) -> None:
    """The adapter and the drafted / accepted tokens with the acceptance rate, where the request had them;
    nothing for a request that had neither; the rate from the counts where the span lacks it."""
    from feature_slice import write_feature_slice

    ids = write_feature_slice(SLICE, tmp_path / "features.jsonl")
    t = build(read_spans(tmp_path / "features.jsonl"), top=3)
    by_key = {lane.key: lane for lane in t.requests}
    assert by_key[ids[0]].features == "LoRA adapter-a; speculative: drafted 30, accepted 21 (70%)"
    assert by_key[ids[1]].features == "LoRA adapter-b"
    assert [lane.features for lane in t.requests if lane.key not in ids] == [""]
    assert features({sc.SPEC_DRAFT_TOKENS: 8, sc.SPEC_ACCEPTED_TOKENS: 2}) == (
        "speculative: drafted 8, accepted 2 (25%)")
    assert features({sc.SPEC_DRAFT_TOKENS: 0, sc.SPEC_ACCEPTED_TOKENS: 0}) == "speculative: drafted 0, accepted 0"
    names = {e["args"]["name"] for e in chrome_trace.events(t) if e.get("name") == "thread_name"}
    assert any("LoRA adapter-a; speculative" in n for n in names)
