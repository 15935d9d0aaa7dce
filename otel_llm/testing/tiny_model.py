"""A tiny random-weights Llama for tests, the demo and benchmarks: no download, no hub.

vLLM's ``load_format="dummy"`` initialises random weights from ``config.json``; the
tokenizer is a ~512-token byte-level BPE trained here on a fixed text. head_dim is 64
because the CPU attention backend rejects small head sizes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Large language models serve requests in batches; "
    "prefill is compute-bound and decode is memory-bandwidth-bound. Time to first token, time per output "
    "token and end-to-end latency describe how a request felt. OpenTelemetry traces tie a slow request "
    "to the engine step that slowed it. 0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ "
)
VOCAB_SIZE = 512


def default_dir() -> Path:
    return Path(os.environ.get("OTEL_LLM_TINY_MODEL_DIR", Path.home() / ".cache" / "otel-llm" / "tiny-llama"))


def ensure_tiny_model(path: str | os.PathLike[str] | None = None) -> str:
    """Create the model folder once (config.json and tokenizer files) and return its path."""
    target = Path(path) if path is not None else default_dir()
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return str(target)
    target.mkdir(parents=True, exist_ok=True)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 50, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(str(target))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "vocab_size": max(VOCAB_SIZE, tok.get_vocab_size()),
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    (target / "config.json").write_text(json.dumps(config, indent=1))
    return str(target)


if __name__ == "__main__":
    print(ensure_tiny_model())
