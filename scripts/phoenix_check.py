"""The demo's traces in a real Arize Phoenix: which project they land in, the span kinds Phoenix shows,
and whether a slow request's ``llm.slow.cause`` is on its span (and in its metadata), with the SLOs it
was judged against (``llm.slo.*``).

Phoenix is heavy (its own server, database and UI): install it in a scratch virtual environment outside
the repository, and point this script at that environment's Python:

    python3.11 -m venv /tmp/phoenix-venv && /tmp/phoenix-venv/bin/pip install arize-phoenix
    ./run demo                                    # writes out/demo-traces.jsonl
    .venv/bin/python scripts/phoenix_check.py --phoenix-python /tmp/phoenix-venv/bin/python \\
        --trace out/demo-traces.jsonl            # writes benchmarks/results/phoenix_check.json

The trace file's export requests are posted as OTLP/protobuf to Phoenix's /v1/traces, as an OTLP
exporter would; what Phoenix made of them is read back from its GraphQL API.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from otel_llm.otlp.json_codec import parse_request

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: bytes, content_type: str) -> bytes:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read()


def graphql(base: str, query: str) -> dict:
    out = json.loads(post(f"{base}/graphql", json.dumps({"query": query}).encode(), "application/json"))
    if out.get("errors"):
        raise RuntimeError(f"GraphQL: {out['errors']}")
    return out["data"]


def wait_ready(base: str, proc: subprocess.Popen, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"phoenix exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise RuntimeError("phoenix did not come up")


PROJECTS = "{ projects { edges { node { id name traceCount } } } }"
SPANS = """{ node(id: "%s") { ... on Project { spans(first: 1000%s) { pageInfo { hasNextPage endCursor }
  edges { node { name spanKind attributes metadata } } } } } }"""
PROJECT_KEY = "openinference.project.name"


def sent_spans(requests: list) -> collections.Counter:
    """Spans per project name (the resource's openinference.project.name; Phoenix's "default" without one)."""
    out: collections.Counter = collections.Counter()
    for req in requests:
        for rs in req.resource_spans:
            name = next((a.value.string_value for a in rs.resource.attributes if a.key == PROJECT_KEY), "default")
            out[name] += sum(len(ss.spans) for ss in rs.scope_spans)
    return out


def shown(name: str) -> str:
    """A request span's name with its model's last path component only (the model is a local folder)."""
    operation, _, model = name.partition(" ")
    return f"{operation} {Path(model).name}" if model else operation


def all_spans(base: str, project_id: str) -> list[dict]:
    """Every span of a project, a page of 1,000 at a time."""
    out, after = [], ""
    while True:
        page = graphql(base, SPANS % (project_id, after))["node"]["spans"]
        out += [e["node"] for e in page["edges"]]
        if not page["pageInfo"]["hasNextPage"]:
            return out
        after = f', after: "{page["pageInfo"]["endCursor"]}"'


def wait_stored(base: str, expected: collections.Counter, timeout: float = 300.0) -> dict[str, list[dict]]:
    """Phoenix inserts spans in the background: read until every project holds what was sent, or its count
    stops growing for 30 s (then what is missing is reported, not waited for)."""
    deadline, last, still = time.monotonic() + timeout, None, time.monotonic()
    while True:
        projects = {e["node"]["name"]: e["node"] for e in graphql(base, PROJECTS)["projects"]["edges"]}
        spans = {name: all_spans(base, p["id"]) for name, p in projects.items()}
        counts = {name: len(v) for name, v in spans.items()}
        if all(counts.get(name, 0) >= n for name, n in expected.items()) or time.monotonic() > deadline:
            return spans
        if counts != last:
            last, still = counts, time.monotonic()
        elif time.monotonic() - still > 30:
            return spans
        time.sleep(3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phoenix-python", required=True, help="python of a virtual environment with arize-phoenix")
    ap.add_argument("--trace", default=str(ROOT / "out" / "demo-traces.jsonl"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "phoenix_check.json"))
    args = ap.parse_args()
    port, grpc = free_port(), free_port()
    work = tempfile.mkdtemp(prefix="phoenix-")
    env = {**os.environ, "PHOENIX_PORT": str(port), "PHOENIX_GRPC_PORT": str(grpc), "PHOENIX_WORKING_DIR": work,
           "PHOENIX_HOST": "127.0.0.1"}
    version = subprocess.run([args.phoenix_python, "-c", "import phoenix; print(phoenix.__version__)"],
                             capture_output=True, text=True, env=env).stdout.strip()
    proc = subprocess.Popen([args.phoenix_python, "-m", "phoenix.server.main", "serve"], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(Path(work) / "phoenix.log", "wb"))
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        requests = [parse_request(line) for line in Path(args.trace).read_bytes().splitlines() if line.strip()]
        for req in requests:
            post(f"{base}/v1/traces", req.SerializeToString(), "application/x-protobuf")
        expected = sent_spans(requests)
        stored = wait_stored(base, expected)
        projects = [e["node"] for e in graphql(base, PROJECTS)["projects"]["edges"]]
        report: dict = {"phoenix_version": version, "export_requests_sent": len(requests),
                        "projects": [{"name": p["name"], "traces": p["traceCount"], "spans_sent": expected.get(p["name"], 0),
                                      "spans_stored": len(stored.get(p["name"], []))} for p in projects]}
        for p in projects:
            spans = stored.get(p["name"], [])
            if not spans:
                continue
            kinds = collections.Counter(f"{s['name'].split(' ')[0]}: {s['spanKind']}" for s in spans)
            judged = []
            for s in spans:
                attrs = json.loads(s["attributes"]) if isinstance(s["attributes"], str) else s["attributes"]
                llm = attrs.get("llm", {}) if isinstance(attrs, dict) else {}
                cause = llm.get("slow", {}).get("cause")
                if cause:
                    judged.append({"span": shown(s["name"]), "kind": s["spanKind"], "llm.slow.cause": cause,
                                   "llm.slo": llm.get("slo"), "metadata": s.get("metadata")})
            causes = collections.Counter(j["llm.slow.cause"] for j in judged)
            examples = list({j["llm.slow.cause"]: j for j in reversed(judged)}.values())[::-1]  # one per cause
            report[p["name"]] = {"spans": len(spans), "kinds": dict(kinds.most_common()),
                                 "unknown_kinds": sum(1 for s in spans if s["spanKind"] == "unknown"),
                                 "requests_with_a_cause": len(judged), "causes": dict(causes.most_common()),
                                 "example_per_cause": examples}
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        print(json.dumps(report, indent=1))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
