"""Client plus server in one command: a real ``vllm serve`` (the tiny model) instrumented with
``opentelemetry-instrument``, and the instrumented ``openai`` client (``client.py``), both exporting
OTLP/HTTP to ``--otlp`` (Jaeger's or a collector's port 4318). Prints the trace ids to open.

    .venv/bin/python examples/client_server/run.py --otlp http://127.0.0.1:4318
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # tests/support: test helpers, not shipped
from support.server import VLLMServer  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--otlp", default="http://127.0.0.1:4318", help="OTLP/HTTP endpoint (no /v1/traces)")
    p.add_argument("--requests", type=int, default=4)
    args = p.parse_args()
    print("starting vllm serve (tiny model, ~40 s) ...", flush=True)
    with VLLMServer(otlp_endpoint=args.otlp, service_name="vllm-server") as server:
        env = {**os.environ, "OTEL_SERVICE_NAME": "example-client", "OTEL_TRACES_EXPORTER": "otlp",
               "OTEL_METRICS_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": args.otlp,
               "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
        subprocess.run([sys.executable, str(Path(__file__).with_name("client.py")), "--base-url", server.base_url,
                        "--requests", str(args.requests)], env=env, check=True)
    print("done: open Jaeger at http://localhost:16686, service 'example-client', and pick a trace")


if __name__ == "__main__":
    main()
