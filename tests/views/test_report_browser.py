"""The report page in a real browser (headless Chromium): no console errors, no network requests, the
expected lanes and labels in the rendered DOM, hovering a request highlights its engine steps; a screenshot.

``OTEL_LLM_SCREENSHOT=docs/report-timeline.png`` also saves the screenshot there (the README's picture)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from browser import Browser, chromium_binary
from otel_llm.views.report import write_report

CHROMIUM = chromium_binary()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed (Debian package `chromium`, "
                                                          "or set CHROMIUM_BIN)")
SLICE = Path(__file__).parent / "data" / "demo-slice.jsonl"


@pytest.fixture(scope="module")
def browser():
    b = Browser(CHROMIUM)
    yield b
    b.close()


def test_report_page_renders_its_lanes_without_errors(browser: Browser, tmp_path: Path) -> None:
    written = write_report(SLICE, tmp_path / "report.html", top=3)
    t = written.timeline
    url = written.html.resolve().as_uri()
    visit = browser.visit(url)
    assert visit.errors == []
    assert visit.requests == [url]  # the page itself, nothing else
    titles = browser.evaluate("[...document.querySelectorAll('g.lane.request')].map(g => g.querySelector('text')"
                              ".textContent)")
    assert titles == [lane.title for lane in t.requests]
    assert browser.evaluate("document.querySelectorAll('g.lane.engine').length") == 1
    legend = browser.evaluate("document.querySelector('.legend').innerText")
    for label in ("queue", "prefill", "decode", "decode stall", "step: prefill", "step: decode", "step: mixed"):
        assert label in legend
    # every kind of bar is drawn with a real size on screen
    for kind in ("queue", "prefill", "chunk", "decode", "stall", "step-mixed", "step-decode"):
        width = browser.evaluate(f"Math.max(...[...document.querySelectorAll('rect.{kind}')]"
                                 ".map(r => r.getBoundingClientRect().width))")
        assert width > 0, kind
    # hovering the slowest request highlights exactly the engine steps it was served by
    first = t.requests[0]
    drawn_steps = {seg.step_id for lane in t.engines for seg in lane.segments}
    highlighted = browser.evaluate(
        "(() => { const g = document.querySelector('g.lane.request');"
        " g.dispatchEvent(new MouseEvent('mouseenter'));"
        " return [...document.querySelectorAll('rect.step.hl')].map(r => Number(r.getAttribute('data-step'))); })()")
    assert set(highlighted) == first.step_ids & drawn_steps and highlighted
    browser.evaluate("document.querySelector('g.lane.request').dispatchEvent(new MouseEvent('mouseleave'))")
    shot = tmp_path / "report.png"
    browser.screenshot(shot)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    if os.environ.get("OTEL_LLM_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["OTEL_LLM_SCREENSHOT"])


def test_the_browser_check_sees_errors_and_fetches(browser: Browser, tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><img src='http://127.0.0.1:9/x.png'>"
                    "<script>console.error('boom'); document.body.setAttribute('data-ready', '1');"
                    " undefinedFunction();</script></body></html>")
    visit = browser.visit(page.as_uri())
    assert any("boom" in e for e in visit.errors) and any("undefinedFunction" in e for e in visit.errors)
    assert "http://127.0.0.1:9/x.png" in visit.requests


PHASES_SLICE = Path(__file__).parent / "data" / "demo-phases-slice.jsonl"  # a demo run's judged requests


def test_verdicts_axis_tooltips_and_latency_curves_render(browser: Browser, tmp_path: Path) -> None:
    written = write_report(PHASES_SLICE, tmp_path / "phases.html", top=8, slo={"ttft": 1.3, "tpot": 0.36})
    t = written.timeline
    visit = browser.visit(written.html.resolve().as_uri())
    assert visit.errors == [] and len(visit.requests) == 1
    # each judged lane says why, in its own line, and its tooltip holds the whole verdict
    whys = browser.evaluate("[...document.querySelectorAll('g.lane.request')].map(g => "
                            "[g.getAttribute('data-cause'), (g.querySelector('text.why') || {}).textContent || '',"
                            " g.querySelector('rect.bg title').textContent])")
    assert [w[0] for w in whys] == [lane.cause for lane in t.requests]
    for (cause, line, full), lane in zip(whys, t.requests):
        if cause:
            assert line.startswith(f"why: {cause}") and lane.verdict in full and "breached" in full
    assert any("> SLO" in w[2] for w in whys)
    # the engine lane says which steps it shows
    engine = browser.evaluate("[...document.querySelectorAll('g.lane.engine text')].map(x => x.textContent)")
    assert any("steps that served kept requests" in x for x in engine) and any("not idle time" in x for x in engine)
    # tooltips carry units, not raw floats
    tips = browser.evaluate("[...document.querySelectorAll('rect.seg title')].map(x => x.textContent)")
    assert any(" ms" in tip for tip in tips) and not any(re.search(r"\d\.\d{7,}", tip) for tip in tips)
    # every axis label lies inside the page's drawing
    overflow = browser.evaluate("(() => { const svg = document.getElementById('timeline').getBoundingClientRect();"
                                " return [...document.querySelectorAll('#timeline text.tick')].filter(x => "
                                "x.getBoundingClientRect().right > svg.right + 0.5).length; })()")
    assert overflow == 0
    # the latency curves: four plots, points drawn on screen, prefill and decode from this file's steps
    curves = browser.evaluate("Object.fromEntries([...document.querySelectorAll('svg.curve')].map(s => "
                              "[s.getAttribute('data-curve'), s.querySelectorAll('circle.pt').length]))")
    assert set(curves) == {"prefill", "decode", "roofline", "ttft"}
    assert curves["prefill"] > 0 and curves["decode"] > 0 and curves["ttft"] == t.total_requests
    size = browser.evaluate("document.querySelector('svg.curve circle.pt').getBoundingClientRect().width")
    assert size > 0
    shot = tmp_path / "phases.png"
    browser.screenshot(shot)
    assert shot.stat().st_size > 10_000
    if os.environ.get("OTEL_LLM_SCREENSHOT_PHASES"):
        shutil.copyfile(shot, os.environ["OTEL_LLM_SCREENSHOT_PHASES"])


def test_lanes_show_the_adapter_and_speculative_acceptance(browser: Browser, tmp_path: Path) -> None:
    """A request with an adapter and speculation, one with an adapter only, one with neither: the first two
    lanes say so in a line of their own (drawn inside their lane) and in their tooltip and table row; the third
    has no such line."""
    from feature_slice import write_feature_slice

    ids = write_feature_slice(SLICE, tmp_path / "features.jsonl")
    written = write_report(tmp_path / "features.jsonl", tmp_path / "features.html", top=3)
    visit = browser.visit(written.html.resolve().as_uri())
    assert visit.errors == [] and len(visit.requests) == 1
    lanes = browser.evaluate(
        "[...document.querySelectorAll('g.lane.request')].map(g => { const f = g.querySelector('text.feat');"
        " const bg = g.querySelector('rect.bg').getBoundingClientRect();"
        " const box = f ? f.getBoundingClientRect() : null;"
        " return [g.getAttribute('data-key'), f ? f.textContent : null, g.querySelector('rect.bg title').textContent,"
        " box ? box.top >= bg.top && box.bottom <= bg.bottom + 0.5 && box.width > 0 : null]; })")
    by_key = {key: (line, tip, inside) for key, line, tip, inside in lanes}
    line, tip, inside = by_key[ids[0]]
    assert line == "LoRA adapter-a; speculative: drafted 30, accepted 21 (70%)" and line in tip and inside
    line, tip, inside = by_key[ids[1]]
    assert line == "LoRA adapter-b" and line in tip and inside
    (other,) = [v for k, v in by_key.items() if k not in ids]
    assert other[0] is None and "LoRA" not in other[1] and "speculative" not in other[1]
    table = browser.evaluate("document.querySelector('table tbody').innerText")
    assert "LoRA adapter-a; speculative: drafted 30, accepted 21 (70%)" in table and "LoRA adapter-b" in table
