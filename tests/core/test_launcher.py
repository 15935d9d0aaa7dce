"""Under ``opentelemetry-instrument`` in a clean venv with openai and without vLLM or TensorRT-LLM: the
instrumentors of the absent engines build nothing, and with nothing listening the script's exit does not wait
out the exporters' retry back-off: our providers' shutdown is cut at its budget (``SHUTDOWN_S``), tested on an
injected clock and timer.

The venv holds the wheel built from this checkout, openai and what both require (offline, from a wheelhouse
repacked from the running environment: tests/support/distributions.py); no ``OTEL_*`` endpoint is set, so our
providers export to the default ``localhost:4318``, where nothing may listen for this test to mean anything.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from otel_llm.core.providers import (METER_PROVIDER, SHUTDOWN_S, TRACER_PROVIDER, BoundedShutdown, ExitBudget,
                                     providers_from)
from otel_llm.guard import Guard
from otel_llm.lifecycle import Lifecycle
from support.launcher import launcher_venv, nothing_listens, run


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return launcher_venv(tmp_path_factory.mktemp("launcher"))


@pytest.fixture(scope="module")
def launched(venv_python: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, float, str]:
    """The script run once under the launcher, with nothing listening where our providers export."""
    if not nothing_listens(4318):
        pytest.skip("something listens on localhost:4318 (the OTLP/HTTP default this test must find closed)")
    return run(venv_python, "launcher", tmp_path_factory.mktemp("launched"))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_absent_engines_build_nothing(launched: tuple[dict, float, str]):
    out, _, _ = launched
    state = out["state"]
    for absent in ("TensorRTLLMInstrumentor", "VLLMInstrumentor"):
        assert state[absent] == {"instrumented": False, "lifecycle": False, "telemetry": False}, absent
    assert state["OpenAIInstrumentor"]["instrumented"] is True  # openai is here: ours runs
    # one provider pair (openai's): one batch span processor and one metric reader, nothing else of ours
    workers = [t for t in out["threads"] if t != "MainThread"]
    assert sorted(workers) == ["OtelBatchSpanRecordProcessor", "OtelPeriodicExportingMetricReader"], workers


# An exit that waited out the SDK's retry back-off takes its 10 s export timeout per signal (twice that with
# both signals); the bounded one takes SHUTDOWN_S plus interpreter teardown, which the machine's load decides.
# The bound sits between the two, so only a shutdown that waits out a back-off fails it; how fast the exit
# is, is benchmarks/core_costs.py's ``exit`` section's to say.
HANG_S = 8.0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_script_does_not_wait_out_the_retry_back_off(venv_python: Path, tmp_path: Path,
                                                          launched: tuple[dict, float, str]):
    _, after_last_line, stderr = launched
    # the same script exporting nothing: what exiting costs without our providers' shutdown
    _, baseline, _ = run(venv_python, "launcher", tmp_path, OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none")
    assert after_last_line - baseline < HANG_S, (after_last_line, baseline, stderr[-3000:])


# -- the bounded shutdown itself, on an injected clock and timer: what our code decides ----------------

class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class SpentTimer:
    """A timer whose budget is spent the moment it starts: ``start`` runs the cut on its own thread (as
    ``threading.Timer`` would after its interval), so a shutdown blocked until the cut gets unblocked."""

    made: list["SpentTimer"] = []

    def __init__(self, interval: float, function) -> None:
        self.interval, self.function = interval, function
        self.cancelled = False
        self.thread = threading.Thread(target=function, daemon=True)
        SpentTimer.made.append(self)

    def start(self) -> None:
        self.thread.start()

    def cancel(self) -> None:
        self.cancelled = True


class UnusedTimer(SpentTimer):
    """A timer that never fires: a shutdown that returns by itself."""

    def start(self) -> None:
        pass


class BlockingExporter:
    """An OTLP exporter with nothing listening: its export retries until the exporter is shut down."""

    def __init__(self) -> None:
        self.stopped = threading.Event()

    def shutdown(self) -> None:
        if self.stopped.is_set():
            raise RuntimeError("shut down twice")  # the SDK's warns; the cut must go on to the next
        self.stopped.set()


class BlockedProvider:
    """A provider whose shutdown exports the rest through ``exporters`` and returns when each gave up."""

    def __init__(self, exporters: list[BlockingExporter]) -> None:
        self.exporters = exporters
        self.returned = False

    def shutdown(self) -> None:
        for exporter in self.exporters:
            # a safety net for a broken cut (the test then fails below, not by hanging), never the path taken
            assert exporter.stopped.wait(60), "the exporter was never told to stop"
        self.returned = True


def test_a_blocked_shutdown_is_cut_at_the_budget_and_its_exporters_are_told_to_stop():
    SpentTimer.made.clear()
    exporters = [BlockingExporter(), BlockingExporter()]
    provider = BlockedProvider(exporters)
    closer = BoundedShutdown(provider, exporters, ExitBudget(SHUTDOWN_S, Clock()), timer=SpentTimer)
    closer()
    [timer] = SpentTimer.made
    assert timer.interval == SHUTDOWN_S  # the budget our code gave the cut
    assert all(e.stopped.is_set() for e in exporters)  # which ends the OTLP exporters' retry back-off
    assert provider.returned and timer.cancelled
    timer.thread.join(60)
    assert not timer.thread.is_alive()


def test_a_cut_goes_on_past_an_exporter_that_fails_to_shut_down():
    SpentTimer.made.clear()
    exporters = [BlockingExporter(), BlockingExporter()]
    exporters[0].stopped.set()  # shut down already: its shutdown raises
    provider = BlockedProvider(exporters)
    BoundedShutdown(provider, exporters, ExitBudget(SHUTDOWN_S, Clock()), timer=SpentTimer)()
    assert exporters[1].stopped.is_set() and provider.returned


def test_a_shutdown_that_returns_in_time_cuts_nothing():
    UnusedTimer.made.clear()
    exporter = BlockingExporter()

    class Answering:
        def shutdown(self) -> None:
            pass

    BoundedShutdown(Answering(), [exporter], ExitBudget(SHUTDOWN_S, Clock()), timer=UnusedTimer)()
    [timer] = UnusedTimer.made
    assert timer.cancelled and not exporter.stopped.is_set()


def test_both_signals_share_one_budget_counted_from_the_first_shutdown():
    clock = Clock()
    budget = ExitBudget(SHUTDOWN_S, clock)
    clock.now = 105.0  # made long before exit: the budget starts with the first shutdown
    assert budget.left() == SHUTDOWN_S
    clock.now += 0.75 * SHUTDOWN_S  # the traces' shutdown took three quarters of it
    assert budget.left() == pytest.approx(0.25 * SHUTDOWN_S)
    clock.now += SHUTDOWN_S
    assert budget.left() == 0.0  # spent: the metrics' shutdown is cut at once


def test_the_providers_we_build_share_one_budget_of_shutdown_s(monkeypatch):
    from opentelemetry import metrics, trace

    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)  # the default: otlp, to localhost:4318
    monkeypatch.delenv("OTEL_METRICS_EXPORTER", raising=False)
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())
    monkeypatch.setattr(metrics, "get_meter_provider", lambda: metrics._internal._ProxyMeterProvider())
    owner = Lifecycle(Guard())
    tp, mp = providers_from(None, None, owner)
    closers = {what: close for what, (_, close) in owner._closers.items()}
    owner.discard(TRACER_PROVIDER)
    owner.discard(METER_PROVIDER)
    traces, meters = closers[TRACER_PROVIDER], closers[METER_PROVIDER]
    assert traces.provider is tp and meters.provider is mp
    assert traces.budget is meters.budget and traces.budget.seconds == SHUTDOWN_S
    assert [type(e).__name__ for e in traces.exporters + meters.exporters] == ["OTLPSpanExporter", "OTLPMetricExporter"]
    assert traces.timer is threading.Timer
    for closer in (traces, meters):  # nothing was exported: both return at once, nothing left running
        closer.timer = UnusedTimer
        closer()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_launcher_logs_one_debug_line_per_absent_engine_and_one_info_line(venv_python: Path, tmp_path: Path):
    out, _, _ = run(venv_python, "initialize", tmp_path)
    ours = out["records"]
    debug = [m for level, m in ours if level == "DEBUG"]
    assert len([m for m in debug if "VLLMInstrumentor" in m]) == 1, ours
    assert len([m for m in debug if "TensorRTLLMInstrumentor" in m]) == 1, ours
    info = [m for level, m in ours if level == "INFO"]
    assert len(info) == 1, ours
    assert "http://localhost:4318/v1/traces" in info[0] and "http://localhost:4318/v1/metrics" in info[0], info
    assert not [m for level, m in ours if level in ("WARNING", "ERROR")], ours
