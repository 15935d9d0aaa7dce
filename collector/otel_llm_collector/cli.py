"""``otel-llm-collector``: run the gateway, check a config, or generate scale-out configs."""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
import threading
from typing import Sequence

from otel_llm.core.slo import SLOTable

from . import __version__
from .config import DEFAULTS_YAML, CollectorConfig, ConfigError


EXIT_LOST = 3  # the gateway stopped with spans it could not deliver (logged and counted)


def _core_version() -> str:
    """The installed otel-llm's version (the core the gateway runs on), as its distribution says."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("otel-llm")
    except PackageNotFoundError:
        return "not installed as a distribution"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="otel-llm-collector",
                                description="OTLP gateway deriving LLM latency metrics and tail-sampling traces")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__} (otel-llm {_core_version()})")
    p.add_argument("--config", help="YAML config file (merged over the embedded defaults)")
    p.add_argument("--check", action="store_true", help="validate the config and exit")
    p.add_argument("--print-defaults", action="store_true", help="print the embedded default config and exit")
    sub = p.add_subparsers(dest="command")
    s = sub.add_parser("scale-config", help="generate the two-tier and all-upstream Collector configs")
    s.add_argument("--out", required=True, help="directory to write the YAML files into")
    s.add_argument("--mode", choices=("two-tier", "upstream", "both"), default="both")
    s.add_argument("--gateways", default="otel-llm-gateway-0:4317,otel-llm-gateway-1:4317",
                   help="comma-separated host:port of the gateways (static resolver)")
    s.add_argument("--dns", help="host[:port] for the dns resolver instead of a static list")
    s.add_argument("--backend", default="tempo:4317", help="OTLP/gRPC endpoint for kept traces")
    s.add_argument("--slo", default="",
                   help='SLOs, e.g. "ttft=0.5,tpot=0.05; big-model: ttft=2; @team-a: tpot=0.03,goodput=0.999"')
    s.add_argument("--baseline-percent", type=float, default=5.0)
    s.add_argument("--slow-threshold-ms", type=int, default=10_000)
    s.add_argument("--target", default="v0.159", choices=("v0.159", "legacy"),
                   help="otelcol-contrib release line the upstream files are written for (component names, "
                        "keys): v0.159 (default) or legacy (the names from before the renames)")
    s.add_argument("--trusted-peers", default=None,
                   help="comma-separated addresses or CIDR blocks the load-balancing tier connects from (exempt "
                        "from the gateways' per-peer shares; default: the private ranges)")
    return p


def tune_process() -> None:
    """Once the gateway is up, move everything allocated so far (imported modules, config, the pipeline's
    objects) out of the cyclic garbage collector's reach: it never becomes garbage, yet every full
    collection walked it again, a pause on the receive path that grows with what was imported
    (benchmarks/collector_throughput.py runs the gateway tuned so). Spans in flight stay collectable. The process is the gateway's own; the library never does this to its host."""
    gc.collect()
    gc.freeze()


def wait_for_signal(stop: threading.Event, poll_s: float = 0.2) -> None:
    """Wait until a signal handler sets ``stop``. Never one untimed ``stop.wait()``: the kernel may deliver
    SIGTERM to any thread (gRPC's and the receivers' run beside this one); Python then only flags the
    signal, and its handler runs when the main thread next executes bytecode, which an untimed wait on
    a lock never does (seen: 3 of 12 gateways under load ignored SIGTERM). A timed wait wakes often
    enough for the handler to run within ``poll_s``."""
    while not stop.wait(poll_s):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.print_defaults:
        print(DEFAULTS_YAML.strip())
        return 0
    if args.command == "scale-config":
        return _scale_config(args)
    try:
        config = CollectorConfig.from_file(args.config) if args.config else CollectorConfig.from_yaml("")
    except ConfigError as exc:
        print(f"otel-llm-collector: bad config: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print("config OK")
        return 0
    from .gateway import Gateway

    logging.basicConfig(level=logging.WARNING, format="otel-llm-collector: %(levelname)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        gateway = Gateway(config).start()
    except OSError as exc:
        print(f"otel-llm-collector: cannot start: {exc}", file=sys.stderr)
        return 1
    tune_process()
    parts = []
    if gateway.grpc:
        parts.append(f"OTLP/gRPC {gateway.grpc_endpoint}")
    if gateway.http:
        parts.append(f"OTLP/HTTP {gateway.http_endpoint}")
    if gateway.prometheus:
        parts.append(f"Prometheus http://{gateway.prometheus_endpoint}/metrics")
    if gateway.own_telemetry:
        parts.append(f"own telemetry http://{gateway.telemetry_endpoint}/metrics")
    print("otel-llm-collector listening: " + ", ".join(parts), flush=True)
    wait_for_signal(stop)
    lost = gateway.shutdown()
    return EXIT_LOST if lost else 0


def _scale_config(args: argparse.Namespace) -> int:
    from .scale_config import ScaleOptions, write

    try:
        slo = SLOTable.parse(args.slo) if args.slo else SLOTable()
    except ValueError as exc:
        print(f"otel-llm-collector scale-config: --slo: {exc}", file=sys.stderr)
        return 2
    gateways = tuple(g.strip() for g in args.gateways.split(",") if g.strip())
    if not gateways and not args.dns:
        print("otel-llm-collector scale-config: give --gateways or --dns", file=sys.stderr)
        return 2
    try:
        extra = {} if args.trusted_peers is None else {
            "trusted_peers": tuple(t.strip() for t in args.trusted_peers.split(",") if t.strip())}
        options = ScaleOptions(gateways=gateways, dns_hostname=args.dns, backend=args.backend, slo=slo,
                               baseline_percent=args.baseline_percent, slow_threshold_ms=args.slow_threshold_ms,
                               target=args.target, **extra)
        paths = write(args.out, options, args.mode)
    except ValueError as exc:
        print(f"otel-llm-collector scale-config: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
