"""The caller's side: plain ``openai`` code plus one line, ``otel_llm.instrument()``.

No other OpenTelemetry set-up: spans go where the standard ``OTEL_*`` variables say
(OTLP/HTTP to http://localhost:4318 by default). Each call's ``traceparent`` travels to the
server, so the server's request span, and its queue/prefill/decode spans, join this trace.

    python examples/client_server/client.py --base-url http://127.0.0.1:8000/v1 --requests 4
"""

from __future__ import annotations

import argparse

import openai

import otel_llm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args()

    otel_llm.instrument()  # the only telemetry line

    client = openai.OpenAI(base_url=args.base_url, api_key="none")
    model = client.models.list().data[0].id
    for i in range(args.requests):
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"Request {i}: tell me about the quick brown fox"}],
            max_tokens=args.max_tokens, stream=True, stream_options={"include_usage": True})
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        print(f"request {i}: {len(text)} characters streamed")


if __name__ == "__main__":
    main()
