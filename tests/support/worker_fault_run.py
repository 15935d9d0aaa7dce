"""One real engine with its model in a separate vLLM worker process (the multiprocess executor, one worker),
our worker-side hook failing there (support/worker_fault_site/sitecustomize.py), for
tests/vllm/test_worker_errors.py: writes what the frontend saw, as JSON, to OTEL_LLM_TEST_RESULT.

    PYTHONPATH=support/worker_fault_site:. python -m support.worker_fault_run
"""

from __future__ import annotations

import json
import os


def main() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    import otel_llm
    from support.log_lines import capture_otel_llm_log
    from support.engine import make_llm

    log = capture_otel_llm_log()
    otel_llm.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider(), sample_rate=1.0)
    llm = make_llm(distributed_executor_backend="mp")
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": [3 + (j * 7) % 500 for j in range(1 + 9 * i)]} for i in range(4)]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0), use_tqdm=False)
    # one more batch: its outputs are processed after the worker's records of the first batch arrived
    outputs += llm.generate(prompts[:1], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    otel_llm.flush()
    stats = otel_llm.stats()
    with open(os.environ["OTEL_LLM_TEST_RESULT"], "w") as f:  # not stdout: vLLM's own lines go there
        json.dump({"generated": [len(o.outputs[0].token_ids) for o in outputs], "pid": os.getpid(),
                   "stats": stats, "log": log.lines}, f, default=str)
    otel_llm.uninstrument()


if __name__ == "__main__":
    main()
