"""The demo's calibration arithmetic (the calibration itself runs on the real engine in the demo)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from otel_llm.core.slo import SLO

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.py"


def load_demo():
    spec = importlib.util.spec_from_file_location("otel_llm_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_slos_are_rounded_up_to_two_digits() -> None:
    demo = load_demo()
    cases = {0.07: "0.070", 0.0123: "0.013", 0.96: "0.96", 14.2: "15", 0.296: "0.30", 0.3: "0.30", 123.4: "130"}
    assert {v: demo._round_up(v) for v in cases} == cases
    for value, text in cases.items():
        assert float(text) >= value


def test_calibration_says_what_it_did_and_its_slos_parse() -> None:
    demo = load_demo()
    cal = demo.Calibration(capacity=10.0, rate=7.0, slo="ttft=0.25,tpot=0.030,e2e=2.1", requests=32)
    assert SLO.parse(cal.slo) == SLO(ttft=0.25, tpot=0.03, e2e=2.1)
    text = cal.describe()
    assert "10.0 req/s" in text and "7.0 req/s" in text and "p90" in text and cal.slo in text
