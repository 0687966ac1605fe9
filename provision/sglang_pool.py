"""SGLang 0.5.23's own rules for sizing its KV cache and hybrid state pool, as pure functions.

Each rule names the file and function of the sglang 0.5.23 wheel (paths under `sglang/srt/`) that it
follows; docs/capacity.md lists them and derives one model by hand. What SGLang sizes by rules this
module does not follow (speculative decoding, pipeline or DP attention, DSA indexers, sliding-window
pools, other hybrid families) raises NotModelled with the reason, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 2**30

# configs/model_config.py:ModelConfig._derive_model_shapes, first branch: the architectures cached as one
# MLA latent per token (is_deepseek_dsa adds an indexer when index_topk is set). Later branches make a few
# more MLA (DeepSeek-V4, MiniCPM3, Kimi-VL/Linear, Bailing V2.5); those, like any other config that carries
# kv_lora_rank, are refused as not modelled rather than sized as MHA.
MLA_ARCHITECTURES = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV3ForCausalLMNextN",
        "Glm4MoeLiteForCausalLM",
        "Glm4MoeLiteForCausalLMNextN",
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaForCausalLMNextN",
        "Glm5NextForConditionalGeneration",
        "Glm5NextForConditionalGenerationNextN",
        "LongcatFlashForCausalLM",
        "LongcatFlashForCausalLMNextN",
        "HYV4ForCausalLM",
        "HYV4ForCausalLMNextN",
        "DotsVLMForCausalLM",
        "Dots3NoteForCausalLM",
        "Dots3NoteForCausalLMNextN",
        "MistralLarge3ForCausalLM",
        "MistralLarge3ForCausalLMEagle",
        "KimiK25ForConditionalGeneration",
        "Eagle3DeepseekV2ForCausalLM",
        "GigaChat35ForCausalLM",
        "GigaChat35ForCausalLMNextN",
    }
)
# configs/hybrid_arch.py:hybrid_gdn_config: Qwen3NextConfig, Qwen3_5Config, Qwen3_5MoeConfig (text part)
GDN_MODEL_TYPES = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"})
# configs/hybrid_arch.py:mamba2_config: NemotronHConfig; configs/nemotron_h.py MAMBA = "M", ATTENTION = "*"
NEMOTRON_H = "nemotron_h"

# arg_groups/fields/schedule.py: --mamba-full-memory-ratio, Arg(fallback=0.9)
MAMBA_FULL_MEMORY_RATIO = 0.9
# mem_cache/kv_cache_configurator.py:KVCacheConfigurator._calculate_mamba_ratio: base
# MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = 3, plus allocation_sizing.py:get_mamba_tracking_slots = 2
# for the extra_buffer strategy under the overlap scheduler, which arg_groups/overrides.py:
# _mamba_radix_cache_resolution picks by default for Qwen3-Next/3.5 and Nemotron-H ("overlap 5").
# With --disable-radix-cache it is 1; with the no_buffer strategy, 3.
MAMBA_SLOTS_PER_REQUEST = 5
# resolve_max_num_reqs: int(tokens / context_len * 512) clamped to [2048, 4096]
DEFAULT_REQS_MIN, DEFAULT_REQS_MAX = 2048, 4096
FP4_SCALE_BLOCK = 16  # pool_configurator.py (MLA) and fp4_kv_cache_quant_method.py SCALE_BLOCK_SIZE
MXFP8_SCALE_BLOCK = 32  # pool_configurator.py:DefaultPoolConfigurator._compute_cell_size, mxfp8 branch
MODEL_DTYPE_BYTES = {"bfloat16": 2, "float16": 2}
TORCH_FLOAT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class NotModelled(ValueError):
    """SGLang sizes this model's or setting's pool by a rule this module does not follow."""


class DoesNotFit(ValueError):
    """SGLang would refuse to start: the weights, or the hybrid state pool, leave no room."""


@dataclass(frozen=True)
class KvDtype:
    name: str
    element_bytes: int  # torch._utils._element_size of the KV storage dtype
    packed_fp4: bool = False  # torch.float4_e2m1fn_x2: two values in each byte, plus block scales
    mxfp8: bool = False


@dataclass(frozen=True)
class StateShape:
    """Inputs of configs/mamba_utils.py:Mamba2StateShape.create, for one hybrid model."""

    layers: int  # layers that keep a conv + SSM state (mamba or linear attention)
    intermediate_size: int
    n_groups: int
    num_heads: int
    head_dim: int
    state_size: int
    conv_kernel: int
    ssm_bytes: int  # mamba_utils.py:mamba2_state_dtype: config mamba_ssm_dtype, else float32
    conv_bytes: int = 2  # SGLANG_MAMBA_CONV_DTYPE unset: bfloat16


@dataclass(frozen=True)
class Geometry:
    """What SGLang's cell size and state pool read from config.json (text_config for VL models)."""

    architecture: str
    attention: str  # "mha" (MHA/GQA) or "mla"
    num_attention_heads: int
    kv_layers: int  # layers that hold KV for each token
    total_layers: int
    kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0
    mla_dim: int = 0  # kv_lora_rank + qk_rope_head_dim
    state: StateShape | None = None
    model_dtype: str = "bfloat16"
    kv_cache_quant_algo: str | None = None

    @property
    def hybrid(self) -> bool:
        return self.state is not None


def kv_dtype(name: str, geom: Geometry | None = None) -> KvDtype:
    """mem_cache/kv_cache_dtype.py:configure_kv_cache_dtype: --kv-cache-dtype to the pool's dtype."""
    if name == "auto":
        if geom is not None and str(geom.kv_cache_quant_algo or "").upper() == "FP8":
            return KvDtype("fp8_e4m3", 1)  # the checkpoint's quant_config asks for an FP8 KV cache
        model = geom.model_dtype if geom is not None else "bfloat16"
        if model not in MODEL_DTYPE_BYTES:
            raise NotModelled(f"kv_cache_dtype auto with model dtype {model!r}")
        return KvDtype(model, MODEL_DTYPE_BYTES[model])
    if name in ("fp8_e4m3", "fp8_e5m2"):
        return KvDtype(name, 1)
    if name == "mxfp8":
        return KvDtype(name, 1, mxfp8=True)
    if name in ("bf16", "bfloat16"):
        return KvDtype("bfloat16", 2)
    if name in ("nvfp4", "fp4_mx_block16"):
        return KvDtype(name, 1, packed_fp4=True)
    raise NotModelled(f"kv_cache_dtype {name!r} (SGLang 0.5.23 refuses it, or it is CPU-only)")


def geometry(config: dict[str, Any]) -> Geometry:
    """Attention and state geometry from a Hugging Face config.json, as SGLang derives it."""
    text = config.get("text_config") or config  # utils/hf_transformers/common.py:get_hf_text_config
    arch = (config.get("architectures") or [""])[0]
    if "sliding_attention" in (text.get("layer_types") or []) or text.get("sliding_window_pattern"):
        raise NotModelled("sliding-window layers (pool_configurator.py:HybridSWAPoolConfigurator)")
    common = _common_geometry(config, text, arch)
    if arch in MLA_ARCHITECTURES:
        return _mla_geometry(text, common)
    if text.get("kv_lora_rank"):
        raise NotModelled(f"{arch}: an MLA-style config outside the architectures modelled here")
    return _mha_geometry(text, common)


def _common_geometry(config: dict[str, Any], text: dict[str, Any], arch: str) -> dict[str, Any]:
    """The Geometry fields every attention kind has."""
    return {
        "architecture": arch,
        "num_attention_heads": int(text["num_attention_heads"]),
        "total_layers": int(text["num_hidden_layers"]),
        "model_dtype": str(text.get("dtype") or text.get("torch_dtype") or config.get("torch_dtype") or "bfloat16"),
        "kv_cache_quant_algo": (config.get("quantization_config") or {}).get("kv_cache_quant_algo"),
    }


def _mla_geometry(text: dict[str, Any], common: dict[str, Any]) -> Geometry:
    if text.get("index_topk") is not None:
        raise NotModelled("DeepSeek DSA indexer cache (pool_configurator.py:_compute_dsa_indexer_cell_size)")
    # kv_cache_configurator.py:calculate_mla_kv_cache_dim: kv_lora_rank + qk_rope_head_dim, one latent per token
    mla_dim = int(text["kv_lora_rank"]) + int(text["qk_rope_head_dim"])
    return Geometry(attention="mla", kv_layers=common["total_layers"], mla_dim=mla_dim, **common)


def _mha_geometry(text: dict[str, Any], common: dict[str, Any]) -> Geometry:
    kv_ids, state = _hybrid_layers(text)
    head_dim = int(text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"])
    return Geometry(
        attention="mha",
        kv_layers=len(kv_ids) if kv_ids is not None else common["total_layers"],
        kv_heads=int(text.get("num_key_value_heads") or text["num_attention_heads"]),
        head_dim=head_dim,
        v_head_dim=int(text.get("v_head_dim") or head_dim),  # model_config.py: v_head_dim falls back to head_dim
        state=state,
        **common,
    )


def _hybrid_layers(text: dict[str, Any]) -> tuple[list[int] | None, StateShape | None]:
    """Full-attention layer ids and the state shape of a hybrid model; (None, None) for a plain one."""
    model_type = text.get("model_type")
    if model_type in GDN_MODEL_TYPES:
        return _gdn(text)
    if model_type == NEMOTRON_H:
        return _nemotron_h(text)
    markers = ("hybrid_override_pattern", "layers_block_type", "linear_num_value_heads", "mamba_num_heads")
    stateful = any("mamba" in str(t) or "linear" in str(t) for t in text.get("layer_types") or [])
    if stateful or any(k in text for k in markers):
        raise NotModelled(f"hybrid model type {model_type!r}: only Qwen3-Next/Qwen3.5 and Nemotron-H are modelled")
    return None, None


def _ssm_bytes(text: dict[str, Any]) -> int:
    # configs/mamba_utils.py:mamba2_state_dtype: SGLANG_MAMBA_SSM_DTYPE, else config mamba_ssm_dtype, else float32
    return TORCH_FLOAT_BYTES.get(str(text.get("mamba_ssm_dtype")), 4)


def _gdn(text: dict[str, Any]) -> tuple[list[int], StateShape]:
    """configs/qwen3_next.py:Qwen3NextConfig.layers_block_type and .mamba2_cache_params (Qwen3.5 inherits both)."""
    layers, interval = int(text["num_hidden_layers"]), int(text["full_attention_interval"])
    full = [i for i in range(layers) if (i + 1) % interval == 0]  # layer_types is not read: the interval is
    state = StateShape(
        layers=layers - len(full),
        intermediate_size=int(text["linear_value_head_dim"]) * int(text["linear_num_value_heads"]),
        n_groups=int(text["linear_num_key_heads"]),
        num_heads=int(text["linear_num_value_heads"]),
        head_dim=int(text["linear_value_head_dim"]),
        state_size=int(text["linear_key_head_dim"]),
        conv_kernel=int(text["linear_conv_kernel_dim"]),
        ssm_bytes=_ssm_bytes(text),
    )
    return full, state


def _nemotron_h(text: dict[str, Any]) -> tuple[list[int], StateShape]:
    """configs/nemotron_h.py:NemotronHConfig.full_attention_layer_ids, .mamba_layer_ids, .mamba2_cache_params."""
    pattern = str(text["hybrid_override_pattern"])
    state = StateShape(
        layers=pattern.count("M"),
        intermediate_size=int(text["mamba_num_heads"]) * int(text["mamba_head_dim"]),
        n_groups=int(text["n_groups"]),
        num_heads=int(text["mamba_num_heads"]),
        head_dim=int(text["mamba_head_dim"]),
        state_size=int(text["ssm_state_size"]),
        conv_kernel=int(text.get("conv_kernel") or 4),
        ssm_bytes=_ssm_bytes(text),  # its config's mamba_ssm_cache_dtype is not the key SGLang reads
    )
    return [i for i, kind in enumerate(pattern) if kind == "*"], state


def cell_bytes(geom: Geometry, dtype: KvDtype, tp: int) -> int:
    """KV bytes per token per GPU: model_executor/pool_configurator.py:DefaultPoolConfigurator._compute_cell_size."""
    layers, size = geom.kv_layers, dtype.element_bytes
    if geom.attention == "mla":
        # one latent of kv_lora_rank + qk_rope_head_dim per layer: no head count, not split by tp
        cell = geom.mla_dim * layers * size
        if dtype.packed_fp4:  # half a byte per value, plus one scale byte per 16 values (kv_scale_buffer)
            cell = cell // 2 + (geom.mla_dim // FP4_SCALE_BLOCK) * layers * size
        return cell
    heads = max(1, geom.kv_heads // tp)  # configs/model_config.py:get_num_kv_heads: replicated past the head count
    if dtype.packed_fp4:
        # fp4_kv_cache_quant_method.py: FP4MXBlock16 / NVFP4 KVCacheMethod.compute_cell_size, K and V of
        # head_dim each, half a byte per value, one scale byte per 16 values (NVFP4 on SM100 trtllm_mha)
        data = heads * (geom.head_dim // 2) * layers * 2 * size
        return data + (heads * geom.head_dim // FP4_SCALE_BLOCK) * layers * 2 * size
    cell = heads * (geom.head_dim + geom.v_head_dim) * layers * size
    if dtype.mxfp8:
        cell += heads * (geom.head_dim + geom.v_head_dim) * layers // MXFP8_SCALE_BLOCK
    return cell


def state_slot_bytes(state: StateShape, tp: int) -> int:
    """One request's conv + SSM state on one GPU: configs/mamba_utils.py:Mamba2StateShape.create and
    BaseLinearStateParams.mamba_cache_per_req."""
    groups = state.n_groups
    if groups % tp:
        groups += tp - groups  # extra_groups_for_head_shards, as written there
    conv_dim = state.intermediate_size + 2 * groups * state.state_size
    if conv_dim % tp or state.num_heads % tp:
        raise DoesNotFit(f"tp={tp} does not divide the state's {conv_dim} conv channels and {state.num_heads} heads")
    conv = conv_dim // tp * (state.conv_kernel - 1)
    temporal = state.num_heads // tp * state.head_dim * state.state_size
    return (conv * state.conv_bytes + temporal * state.ssm_bytes) * state.layers


@dataclass(frozen=True)
class Pool:
    """How SGLang splits one GPU's KV budget (`rest`): the pool sizes it would start with."""

    tp: int
    rest_bytes: int
    cell_bytes: int
    max_total_num_tokens: int
    kv_bytes: int
    mamba_slots: int | None = None
    slot_bytes: int | None = None

    @property
    def state_bytes(self) -> int:
        return (self.mamba_slots + 1) * self.slot_bytes if self.mamba_slots is not None else 0


def size_pool(
    geom: Geometry,
    dtype: KvDtype,
    tp: int,
    rest_bytes: float,
    mamba_ratio: float = MAMBA_FULL_MEMORY_RATIO,
    page_size: int = 1,
) -> Pool:
    """rest -> (state slots, tokens), as KVCacheConfigurator._profile_available_bytes and
    _handle_max_mamba_cache (auto branch), then DefaultPoolConfigurator.calculate_pool_sizes."""
    if geom.num_attention_heads % tp:
        raise DoesNotFit(f"tp={tp} does not divide the {geom.num_attention_heads} attention heads")
    if rest_bytes <= 0:
        raise DoesNotFit("the weights leave no GPU memory for the KV cache (SGLang: raise --mem-fraction-static)")
    cell = cell_bytes(geom, dtype, tp)
    slots = slot = None
    kv_bytes = rest_bytes
    if geom.state is not None:
        slot = state_slot_bytes(geom.state, tp)
        budget = rest_bytes * mamba_ratio / (1 + mamba_ratio)  # the state pool takes r/(1+r) of rest
        slots = int((budget - slot) // slot)  # one padding slot besides the usable ones
        if slots <= 0:
            raise DoesNotFit(f"not enough GPU memory for the hybrid state cache ({slot / 2**20:.1f} MiB a slot)")
        kv_bytes = rest_bytes - (slots + 1) * slot
    tokens = int(kv_bytes) // cell // page_size * page_size
    if tokens <= 0:
        raise DoesNotFit("not enough memory for one page of KV cache (SGLang: increase --mem-fraction-static)")
    return Pool(tp, int(rest_bytes), cell, tokens, int(kv_bytes), slots, slot)


def max_running_requests(
    pool: Pool, context_len: int, requested: int | None = None, slots_per_request: int = MAMBA_SLOTS_PER_REQUEST
) -> int:
    """mem_cache/kv_cache_configurator.py:KVCacheConfigurator.resolve_max_num_reqs (one DP rank)."""
    tokens = pool.max_total_num_tokens
    estimated = max(min(int(tokens / context_len * 512), DEFAULT_REQS_MAX), DEFAULT_REQS_MIN)
    reqs = min(requested or estimated, tokens // 2)
    if pool.mamba_slots is not None:
        reqs = min(reqs, pool.mamba_slots // slots_per_request)
    return reqs


def rest_from_hardware(free_bytes: float, weights_bytes: float, tp: int, mem_fraction_static: float) -> float:
    """KVCacheConfigurator._profile_available_bytes: rest = free after loading - free before x (1 - mfs);
    free after loading is free before less this GPU's share of the weights (weights / tp)."""
    return free_bytes * mem_fraction_static - weights_bytes / tp
