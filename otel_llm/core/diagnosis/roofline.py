"""Roofline of one engine step: FLOPs, bytes moved, arithmetic intensity, bound, MFU and MBU.

Pure arithmetic on a decoder-only transformer's shape (``ModelShape``) and a step's batch
composition: for each request in the step, ``n`` tokens computed after ``c`` tokens already in
its KV cache (a prefill chunk covers positions c .. c+n-1; a decode is n=1 after c). With
T = sum(n) tokens, R requests, L layers, hidden h, H query heads, K KV heads, head dim d,
vocabulary V, and P the active weights of the layers (attention and MLP, MoE: the experts a
token uses):

  FLOPs  = 2 * P * T                                 every matmul of the layers, per token
         + 4 * L * H * d * sum(n*c + n*(n+1)/2)      causal attention: QK^T and AV over the keys
                                                     each token sees (position + 1)
         + 2 * h * V * (R + D)                       the LM head, on each sampled position: one per
                                                     request, plus each speculative draft token the
                                                     step verified (D; its n counts them already)
  bytes  = b_w * (W + V*h + T*h)                     weights read once per step (W: the layers'
                                                     weights the step touches), LM head, embedding rows
         + 2 * L * K * d * b_kv * sum(c + n)         KV cache read (every key a token attends to)
         + 2 * L * K * d * b_kv * T                  KV cache written (this step's tokens)
         + b_a * T * L * (4h + 2(H+K)d + 3*I_act)    activations in and out of each matmul
         + b_a * (R + D) * (h + V)                   LM head input and logits
  intensity = FLOPs / bytes; ridge = peak FLOP/s / peak B/s
  bound = compute if intensity >= ridge else memory
  predicted time = max(FLOPs / peak FLOP/s, bytes / peak B/s)
  MFU = FLOPs / (time * peak FLOP/s); MBU = bytes / (time * peak B/s)

Norms, rotary embeddings, softmax and the sampler are left out (a few percent of a layer's
FLOPs at the model sizes served). MoE: W counts the experts the step's tokens can touch,
min(E, T*k) of E per layer (every expert once a batch is large); P counts k experts per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

_DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2,
                "bf16": 2, "float8": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1, "uint8": 1}


def dtype_bytes(dtype: Any, default: int = 2) -> int:
    """Bytes per element of a dtype given as a torch dtype or a name (``torch.bfloat16``, ``"fp8"``)."""
    if dtype is None:
        return default
    name = str(dtype).rsplit(".", 1)[-1].lower()
    if name in _DTYPE_BYTES:
        return _DTYPE_BYTES[name]
    if name.startswith("fp8") or name.startswith("float8"):
        return 1
    return default


@dataclass(frozen=True)
class ModelShape:
    """What the roofline needs of a decoder-only transformer."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width (gated: gate, up, down); MoE: one expert's width
    vocab: int
    weight_bytes: int = 2
    kv_bytes: int = 2
    act_bytes: int = 2
    experts: int = 0  # MoE: experts per layer (0: dense)
    experts_per_token: int = 0
    shared_intermediate: int = 0  # MoE: width of always-on shared experts, if any
    tied_embeddings: bool = False

    @property
    def attention_params(self) -> int:
        """Per layer: Q, K, V and O projections."""
        h, d = self.hidden, self.head_dim
        return h * self.heads * d + 2 * h * self.kv_heads * d + self.heads * d * h

    @property
    def mlp_params_active(self) -> int:
        """Per layer, per token: the MLP weights one token multiplies (MoE: k experts, router, shared)."""
        if not self.experts:
            return 3 * self.hidden * self.intermediate
        return (3 * self.hidden * self.intermediate * self.experts_per_token + self.hidden * self.experts
                + 3 * self.hidden * self.shared_intermediate)

    @property
    def active_params(self) -> int:
        """Weights of the layers a token multiplies (embedding and LM head apart)."""
        return self.layers * (self.attention_params + self.mlp_params_active)

    @property
    def params(self) -> int:
        """All weights: layers (every expert), embedding, LM head (once if tied), norms."""
        mlp = 3 * self.hidden * self.intermediate * max(self.experts, 1)
        if self.experts:
            mlp += self.hidden * self.experts + 3 * self.hidden * self.shared_intermediate
        layers = self.layers * (self.attention_params + mlp + 2 * self.hidden)
        embed = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return layers + embed + self.hidden

    def layer_weights_touched(self, tokens: int) -> int:
        """Weights of the layers read by a step of ``tokens`` tokens (MoE: the experts they can reach)."""
        if not self.experts:
            return self.active_params
        used = min(self.experts, tokens * self.experts_per_token)
        mlp = 3 * self.hidden * self.intermediate * used + self.hidden * self.experts \
            + 3 * self.hidden * self.shared_intermediate
        return self.layers * (self.attention_params + mlp)

    @classmethod
    def from_hf_config(cls, config: Any, dtype: Any = None, kv_cache_dtype: Any = None) -> "ModelShape":
        """From a Hugging Face config object (or a dict of its fields); ``dtype`` of weights and
        activations, ``kv_cache_dtype`` ("auto" or None: the weights')."""
        get = config.get if isinstance(config, Mapping) else (lambda k, d=None: getattr(config, k, d))
        text = get("text_config")  # multimodal wrappers keep the language model's fields here
        if text is not None:
            get = text.get if isinstance(text, Mapping) else (lambda k, d=None: getattr(text, k, d))
        hidden = int(get("hidden_size"))
        heads = int(get("num_attention_heads"))
        kv_heads = int(get("num_key_value_heads") or heads)
        head_dim = int(get("head_dim") or hidden // heads)
        experts = int(get("num_local_experts") or get("num_experts") or get("n_routed_experts") or 0)
        per_token = int(get("num_experts_per_tok") or get("moe_topk") or 0) if experts else 0
        inter = int((get("moe_intermediate_size") if experts else None) or get("intermediate_size"))
        shared = int(get("shared_expert_intermediate_size") or 0)
        if experts and not shared and get("n_shared_experts"):
            shared = int(get("n_shared_experts")) * inter
        w = dtype_bytes(dtype if dtype is not None else get("torch_dtype"))
        kv = w if kv_cache_dtype in (None, "auto") else dtype_bytes(kv_cache_dtype, w)
        return cls(layers=int(get("num_hidden_layers")), hidden=hidden, heads=heads, kv_heads=kv_heads,
                   head_dim=head_dim, intermediate=inter, vocab=int(get("vocab_size")), weight_bytes=w,
                   kv_bytes=kv, act_bytes=w, experts=experts, experts_per_token=per_token,
                   shared_intermediate=shared, tied_embeddings=bool(get("tie_word_embeddings", False)))


@dataclass(frozen=True, slots=True)
class StepCost:
    flops: float
    bytes: float
    tokens: int
    requests: int

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else 0.0


def step_cost(shape: ModelShape, work: Iterable[tuple[int, int]], draft_tokens: int = 0) -> StepCost:
    """FLOPs and bytes of one step; ``work`` is (tokens n, context c) per request in the step, a verify
    share's ``n`` counting its draft tokens; ``draft_tokens``: those the step verified (logits at each)."""
    tokens = requests = 0
    attended = 0.0  # sum over the step's tokens of the keys each attends to
    kv_read = 0  # sum of c + n
    for n, c in work:
        tokens += n
        requests += 1
        attended += n * c + n * (n + 1) / 2
        kv_read += c + n
    return _cost(shape, tokens, requests, attended, kv_read, draft_tokens)


def decode_step_cost(shape: ModelShape, contexts: Sequence[int]) -> StepCost:
    """``step_cost`` of a step where every request computes one token (a plain decode batch), from the
    contexts alone: sums in C instead of a Python loop per request (each step's metrics need it)."""
    n = len(contexts)
    c = sum(contexts)
    return _cost(shape, n, n, float(c + n), c + n)  # n * c + n(n+1)/2 with n = 1 is c + 1


def _cost(shape: ModelShape, tokens: int, requests: int, attended: float, kv_read: int,
          draft_tokens: int = 0) -> StepCost:
    s = shape
    h, d, L = s.hidden, s.head_dim, s.layers
    sampled = requests + draft_tokens  # positions the LM head computes logits for
    flops = 2.0 * s.active_params * tokens + 4.0 * L * s.heads * d * attended + 2.0 * h * s.vocab * sampled
    kv_entry = 2 * L * s.kv_heads * d * s.kv_bytes  # K and V of one token, all layers
    inter_active = s.intermediate * (s.experts_per_token if s.experts else 1) + s.shared_intermediate
    act_per_token = L * (4 * h + 2 * (s.heads + s.kv_heads) * d + 3 * inter_active)
    nbytes = (s.weight_bytes * (s.layer_weights_touched(tokens) + s.vocab * h + tokens * h)
              + kv_entry * (kv_read + tokens)
              + s.act_bytes * (tokens * act_per_token + sampled * (h + s.vocab)))
    return StepCost(flops, float(nbytes), tokens, requests)


@dataclass(frozen=True)
class DevicePeaks:
    """Peak dense compute (FLOP/s) and memory bandwidth (B/s) of the devices a model runs on."""

    name: str
    flops: float
    bandwidth: float

    @property
    def ridge(self) -> float:
        """The arithmetic intensity (FLOP/byte) where memory-bound turns compute-bound."""
        return self.flops / self.bandwidth

    def times(self, n: int) -> "DevicePeaks":
        """``n`` such devices (tensor/pipeline parallel): a step's work is spread over all of them."""
        return self if n <= 1 else DevicePeaks(f"{n}x {self.name}", self.flops * n, self.bandwidth * n)


@dataclass(frozen=True, slots=True)
class Roofline:
    flops: float
    bytes: float
    intensity: float
    bound: str  # "compute" | "memory"
    predicted_s: float
    mfu: float | None  # None without a measured time
    mbu: float | None


def roofline(cost: StepCost, peaks: DevicePeaks, measured_s: float | None) -> Roofline:
    intensity = cost.intensity
    bound = "compute" if intensity >= peaks.ridge else "memory"
    predicted = max(cost.flops / peaks.flops, cost.bytes / peaks.bandwidth)
    if measured_s and measured_s > 0:
        mfu: float | None = cost.flops / (measured_s * peaks.flops)
        mbu: float | None = cost.bytes / (measured_s * peaks.bandwidth)
    else:
        mfu = mbu = None
    return Roofline(cost.flops, cost.bytes, intensity, bound, predicted, mfu, mbu)

