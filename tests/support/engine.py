"""The real vLLM engine on the CPU, with the tiny model: shared settings for tests, demo and benchmarks."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from .tiny_model import ensure_tiny_model

ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "TOKENIZERS_PARALLELISM": "false",
}


def prepare_env() -> None:
    for k, v in ENV.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def engine_args(**overrides: Any) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` / ``EngineArgs`` that work on this CPU build."""
    args: dict[str, Any] = dict(
        model=ensure_tiny_model(),
        load_format="dummy",
        dtype="float32",
        enforce_eager=True,
        max_model_len=512,
        max_num_seqs=16,
        max_num_batched_tokens=64,  # small: long prompts are prefilled in chunks
        kv_cache_memory_bytes=64 << 20,
        enable_prefix_caching=False,
        disable_log_stats=False,
    )
    args.update(overrides)
    return args


def make_llm(**overrides: Any) -> Any:
    prepare_env()
    from vllm import LLM

    return LLM(**engine_args(**overrides))


def serve_command(port: int, cli: bool = False, **overrides: Any) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server ...`` for the tiny model (the ``vllm`` console
    script fails under the ``vllm-cpu`` distribution: it looks up metadata for ``vllm``); with
    ``cli``, the ``vllm serve`` command line itself (through ``support.vllm_cli``)."""
    a = engine_args(**overrides)
    entry = ["-m", "support.vllm_cli", "serve"] if cli else ["-m", "vllm.entrypoints.openai.api_server"]
    cmd = [*entry, "--model", a["model"], "--load-format", "dummy",
           "--dtype", "float32", "--enforce-eager", "--max-model-len", str(a["max_model_len"]),
           "--max-num-seqs", str(a["max_num_seqs"]), "--max-num-batched-tokens", str(a["max_num_batched_tokens"]),
           "--kv-cache-memory-bytes", str(a["kv_cache_memory_bytes"]), "--no-enable-prefix-caching",
           "--host", "127.0.0.1", "--port", str(port)]
    return cmd


@contextlib.contextmanager
def in_process() -> Iterator[None]:
    """Engines built inside run their EngineCore in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    saved = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved


def keep_step_records(telemetry: Any) -> list[Any]:
    """Every step record that reaches the frontend's pipeline ``telemetry``, in a list, as well as the
    pipeline (the receiver looks ``add_step`` up per drain, so replacing it catches them all)."""
    records: list[Any] = []
    add_step = telemetry.add_step

    def keep(step: Any) -> None:
        records.append(step)
        add_step(step)

    telemetry.add_step = keep
    return records
