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
