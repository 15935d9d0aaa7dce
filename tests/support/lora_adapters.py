"""LoRA adapters for the tiny model in tests: written as the demo writes them (``otel_llm.demo.adapters``),
and a probe of vLLM's own adapter cache in the worker."""

from __future__ import annotations

from otel_llm.demo.adapters import RANK, write_adapter  # noqa: F401  (re-exported)


def watch_adapter_cache(worker) -> int:
    """Run in a vLLM worker (``LLM.collective_rpc``): record, from vLLM's own adapter manager, every adapter it
    adds to its cache (a load: ``LoRAModelManager._add_adapter``) and every one its cache drops (an eviction:
    the LRU cache's ``_on_remove``), in order. Self-contained: it is sent by value."""
    manager = worker.model_runner.lora_manager._adapter_manager
    cache = manager._registered_adapters
    log: list = []
    worker.adapter_cache_log = log
    add, on_remove = manager._add_adapter, cache._on_remove

    def added(lora):
        log.append(("loaded", lora.id))
        return add(lora)

    def removed(key, value):
        log.append(("evicted", key))
        return on_remove(key, value)

    manager._add_adapter = added
    cache._on_remove = removed
    return len(cache)


def read_adapter_cache_log(worker) -> list:
    """Run in a vLLM worker: what ``watch_adapter_cache`` recorded."""
    return list(worker.adapter_cache_log)
