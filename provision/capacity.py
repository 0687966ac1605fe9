"""Serving capacity in terms people plan with, from what SGLang reports.

Facts (shared/reference/sglang-nccl.md §3, §5): `max_total_num_tokens` is the KV pool in tokens;
sessions at a context size = tokens / size; KV bytes per token per GPU for MHA/GQA attention =
max(1, kv_heads // tp) * (head_dim + v_head_dim) * kv_layers * dtype bytes, where a hybrid
linear-attention model (Qwen3-Next, Qwen3.5) counts only its full-attention layers.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

DTYPE_BYTES = {"bf16": 2, "bfloat16": 2, "float16": 2, "fp16": 2, "auto": 2, "fp8_e4m3": 1, "fp8_e5m2": 1,
               "mxfp8": 1, "float32": 4, "fp32": 4}  # fmt: skip
DEFAULT_SESSION_TOKENS = (32768,)


@dataclass
class SessionFit:
    tokens: int
    sessions: float

    @property
    def label(self) -> str:
        return f"{self.tokens // 1024}K" if self.tokens % 1024 == 0 else f"{self.tokens:,}-token"


@dataclass
class KvModel:
    """Per-token KV cost from a model's config.json."""

    kv_heads: int
    head_dim: int
    v_head_dim: int
    kv_layers: int
    total_layers: int
    hybrid: bool

    def bytes_per_token_per_gpu(self, tp: int, dtype_bytes: int) -> int:
        return max(1, self.kv_heads // max(tp, 1)) * (self.head_dim + self.v_head_dim) * self.kv_layers * dtype_bytes


@dataclass
class Capacity:
    max_total_num_tokens: int
    kv_cache_dtype: str
    context_length: int
    max_running_requests: int | None
    tp_size: int
    full_context_sessions: float
    sessions: list[SessionFit] = field(default_factory=list)
    kv_bytes_per_token_per_gpu: int | None = None
    kv_pool_gib_per_gpu: float | None = None
    model: dict[str, Any] | None = None
    predictions: list[dict[str, Any]] = field(default_factory=list)

    def sentence(self) -> str:
        """'780,820 tokens ≈ 2.98 × 262,144-token sessions ≈ 23.8 × 32K sessions'."""
        parts = [
            f"{self.max_total_num_tokens:,} tokens",
            f"{self.full_context_sessions:.2f} × {self.context_length:,}-token sessions",
        ]
        parts += [f"{s.sessions:.1f} × {s.label} sessions" for s in self.sessions]
        return " ≈ ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["summary"] = self.sentence()
        return data


def kv_model_from_config(config: dict[str, Any]) -> KvModel | None:
    """Read attention geometry from a HF config.json (VL checkpoints nest it under text_config)."""
    cfg = config.get("text_config") or config
    layers = cfg.get("num_hidden_layers")
    heads = cfg.get("num_attention_heads")
    if not layers or not heads:
        return None
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or (cfg.get("hidden_size", 0) // heads)
    v_head_dim = cfg.get("v_head_dim") or head_dim
    interval = cfg.get("full_attention_interval")
    layer_types = cfg.get("layer_types")
    if layer_types:
        kv_layers = sum(1 for t in layer_types if "full" in str(t) or t == "attention")
        hybrid = kv_layers < layers
    elif interval:
        kv_layers = sum(1 for layer in range(layers) if (layer + 1) % int(interval) == 0)
        hybrid = True
    else:
        kv_layers, hybrid = layers, False
    return KvModel(int(kv_heads), int(head_dim), int(v_head_dim), kv_layers, int(layers), hybrid)


def compute(
    server_info: dict[str, Any],
    models: dict[str, Any] | None = None,
    session_tokens: tuple[int, ...] = DEFAULT_SESSION_TOKENS,
    model_config: dict[str, Any] | None = None,
    predict_tp: tuple[int, ...] = (),
    predict_kv_gib_per_gpu: tuple[float, ...] = (),
) -> Capacity:
    tokens = int(server_info.get("max_total_num_tokens") or 0)
    if tokens <= 0:
        raise ValueError("server_info has no max_total_num_tokens: is this an SGLang server that finished starting?")
    context = None
    for model in (models or {}).get("data", []):
        context = model.get("max_model_len") or context
    context = int(context or server_info.get("context_length") or 0)
    if context <= 0:
        raise ValueError("no context length: neither /v1/models max_model_len nor server_info context_length")
    dtype = str(server_info.get("kv_cache_dtype") or "auto")
    tp = int(server_info.get("tp_size") or 1)
    cap = Capacity(
        max_total_num_tokens=tokens,
        kv_cache_dtype=dtype,
        context_length=context,
        max_running_requests=server_info.get("max_running_requests"),
        tp_size=tp,
        full_context_sessions=tokens / context,
        sessions=[SessionFit(t, tokens / t) for t in session_tokens],
    )
    kv = kv_model_from_config(model_config) if model_config else None
    if kv is not None:
        dtype_bytes = DTYPE_BYTES.get(dtype, 2)
        per_gpu = kv.bytes_per_token_per_gpu(tp, dtype_bytes)
        cap.kv_bytes_per_token_per_gpu = per_gpu
        cap.kv_pool_gib_per_gpu = round(tokens * per_gpu / 2**30, 2)
        cap.model = asdict(kv)
        budget = tokens * per_gpu  # bytes of KV pool per GPU today
        for other_tp in predict_tp:
            # same KV budget per GPU; the per-token cost per GPU changes with how the KV heads split
            other = kv.bytes_per_token_per_gpu(other_tp, dtype_bytes)
            predicted = math.floor(budget / other)
            cap.predictions.append(
                {"what": f"tp={other_tp}, same KV memory per GPU", "max_total_num_tokens": predicted,
                 "full_context_sessions": round(predicted / context, 2)}
            )  # fmt: skip
        for gib in predict_kv_gib_per_gpu:
            predicted = math.floor(gib * 2**30 / per_gpu)
            cap.predictions.append(
                {"what": f"{gib:g} GiB of KV pool per GPU at tp={tp}", "max_total_num_tokens": predicted,
                 "full_context_sessions": round(predicted / context, 2)}
            )  # fmt: skip
    return cap


def load_json(text: str) -> dict[str, Any]:
    return json.loads(text) if text.strip() else {}
