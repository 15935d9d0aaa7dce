"""LoRA adapters for the tiny model, written by hand (no peft): ``adapter_config.json`` and
``adapter_model.safetensors`` with q_proj and v_proj weights of rank 8 in every layer."""

from __future__ import annotations

import json
from pathlib import Path

RANK = 8


def write_adapter(directory: str | Path, seed: int, layers: int = 2, hidden: int = 128, q_out: int = 128,
                  v_out: int = 64) -> str:
    """One adapter in ``directory`` (created); small random weights from ``seed``. Returns its path."""
    import torch
    from safetensors.torch import save_file

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": RANK, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"],
        "lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM"}))
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(layers):
        for proj, out in (("q_proj", q_out), ("v_proj", v_out)):
            prefix = f"base_model.model.model.layers.{i}.self_attn.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = 0.01 * torch.randn(RANK, hidden, generator=g)
            tensors[f"{prefix}.lora_B.weight"] = 0.01 * torch.randn(out, RANK, generator=g)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    return str(path)


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
