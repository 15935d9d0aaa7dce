"""A tiny random-weights Llama for the demo, tests and benchmarks: no download, no hub.

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
# room for long generations (a 4,096-token decode after a prompt); engines still choose their own
# max_model_len (engine.py: 512), so a larger value costs nothing (a rotary table of 8192 x 64 floats)
MAX_POSITIONS = 8192


def default_dir() -> Path:
    return Path(os.environ.get("OTEL_LLM_TINY_MODEL_DIR", Path.home() / ".cache" / "otel-llm" / "tiny-llama"))


def ensure_tiny_model(path: str | os.PathLike[str] | None = None) -> str:
    """Create the model folder once (config.json and tokenizer files) and return its path."""
    target = Path(path) if path is not None else default_dir()
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        _raise_positions(target / "config.json")
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
        "max_position_embeddings": MAX_POSITIONS,
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


def _raise_positions(config_path: Path) -> None:
    """A folder made by an earlier version (1,024 positions): raise it in place. Written atomically,
    as another process may be loading the model at the same time."""
    config = json.loads(config_path.read_text())
    if config.get("max_position_embeddings", 0) >= MAX_POSITIONS:
        return
    config["max_position_embeddings"] = MAX_POSITIONS
    tmp = config_path.with_name(f".config.{os.getpid()}.json")
    tmp.write_text(json.dumps(config, indent=1))
    os.replace(tmp, config_path)


if __name__ == "__main__":
    print(ensure_tiny_model())
