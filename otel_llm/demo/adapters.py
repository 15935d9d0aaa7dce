"""LoRA adapters for the tiny model, written by hand (no peft, no hub): ``adapter_config.json`` and
``adapter_model.safetensors`` with small random q_proj and v_proj weights in every layer."""

from __future__ import annotations

import json
from pathlib import Path

RANK = 8  # the engine's max_lora_rank must be at least this


def write_adapter(directory: str | Path, seed: int, layers: int = 2, hidden: int = 128, q_out: int = 128,
                  v_out: int = 64) -> str:
    """One adapter in ``directory`` (created, or reused when already written); weights from ``seed``.
    The default shapes are the tiny model's (``tiny_model``: hidden 128, one KV head of 64). Returns its path."""
    path = Path(directory)
    config, weights = path / "adapter_config.json", path / "adapter_model.safetensors"
    if config.exists() and weights.exists():
        return str(path)
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(layers):
        for proj, out in (("q_proj", q_out), ("v_proj", v_out)):
            prefix = f"base_model.model.model.layers.{i}.self_attn.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = 0.01 * torch.randn(RANK, hidden, generator=g)
            tensors[f"{prefix}.lora_B.weight"] = 0.01 * torch.randn(out, RANK, generator=g)
    save_file(tensors, str(weights))
    config.write_text(json.dumps({
        "peft_type": "LORA", "r": RANK, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"],
        "lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM"}))  # last: its presence means complete
    return str(path)
