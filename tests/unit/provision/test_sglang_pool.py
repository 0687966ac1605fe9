"""SGLang 0.5.23's pool-sizing rules on four real config.json files (tests/unit/fixtures/model_configs).

Every expected figure is worked out by hand in the comment beside it from the rule in the wheel that
provision/sglang_pool.py cites; docs/capacity.md walks through Qwen3.5-122B-A10B in full.
"""

import json

import pytest

from provision import sglang_pool as sp
from provision.capacity import plan
from tests.unit import FIXTURES

CONFIGS = FIXTURES / "model_configs"
GIB = 2**30
# H200: nvidia-smi reports 143,771 MiB (140.4 GiB); 140 GiB free before loading and a static fraction of
# 0.88 are round inputs for the figures below, not measurements
H200_FREE_GIB, MFS = 140, 0.88
STATIC = 140 * GIB * 0.88  # 132,284,992,716.8 bytes for weights and cache on each GPU
LLAMA_70B_WEIGHTS = 141_107_412_992  # index total_size = 2 B x 70,553,706,496 params (derived in the README)
DEEPSEEK_V3_WEIGHTS = 688_586_727_753  # quoted size of the FP8 checkpoint (see the README: not read from its index)


def config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def geom(name: str) -> sp.Geometry:
    return sp.geometry(config(name))


def test_qwen35_122b_keeps_kv_in_12_of_48_layers_and_state_in_36():
    g = geom("qwen3.5-122b-a10b")
    # qwen3_next.py layers_block_type: (l + 1) % full_attention_interval(4) == 0 -> layers 3, 7, ..., 47
    assert (g.attention, g.kv_layers, g.total_layers, g.kv_heads, g.head_dim) == ("mha", 12, 48, 2, 256)
    assert g.state == sp.StateShape(
        layers=36,
        intermediate_size=128 * 64,
        n_groups=16,
        num_heads=64,
        head_dim=128,
        state_size=128,
        conv_kernel=4,
        ssm_bytes=4,
    )


def test_qwen35_122b_cell_bytes_by_dtype_and_tp():
    g = geom("qwen3.5-122b-a10b")
    bf16, fp8, fp4 = (sp.kv_dtype(n, g) for n in ("auto", "fp8_e4m3", "fp4_mx_block16"))
    # max(1, 2 // tp) heads x (256 + 256) x 12 layers x 2 B: 24,576 at tp=1; 12,288 from tp=2 on (heads replicated)
    assert [sp.cell_bytes(g, bf16, tp) for tp in (1, 2, 4, 8)] == [24576, 12288, 12288, 12288]
    assert sp.cell_bytes(g, fp8, 2) == 1 * 512 * 12 * 1 == 6144
    # fp4: 1 head x (256 // 2) x 12 x 2 (K, V) x 1 B = 3,072 data + (1 x 256 // 16) x 12 x 2 x 1 = 384 scales
    assert sp.cell_bytes(g, fp4, 2) == 3072 + 384 == 3456


def test_qwen35_122b_state_slot():
    s = geom("qwen3.5-122b-a10b").state
    # conv_dim = 8,192 + 2 x 16 x 128 = 12,288; per layer at tp=2: 12,288 / 2 x 3 x 2 B (bf16 conv) = 36,864
    # + 64 / 2 x 128 x 128 x 4 B (fp32 SSM) = 2,097,152 -> 2,134,016; x 36 layers = 76,824,576 (73.3 MiB)
    assert sp.state_slot_bytes(s, 2) == 36 * (6144 * 3 * 2 + 32 * 128 * 128 * 4) == 76_824_576
    assert sp.state_slot_bytes(s, 1) == 2 * 76_824_576


def test_qwen35_122b_split_of_18_gib_at_tp2():
    g = geom("qwen3.5-122b-a10b")
    pool = sp.size_pool(g, sp.kv_dtype("bf16", g), 2, 18 * GIB)
    # rest 19,327,352,832 B; state budget rest x 0.9 / 1.9 = 9,155,061,867.8; slots = floor(budget / slot) - 1
    # = 119 - 1 = 118; state pool (118 + 1) x 76,824,576 = 9,142,124,544; KV gets 10,185,228,288 B
    assert (pool.mamba_slots, pool.state_bytes, pool.kv_bytes) == (118, 9_142_124_544, 10_185_228_288)
    assert pool.max_total_num_tokens == 10_185_228_288 // 12288 == 828_876
    # resolve_max_num_reqs: clamp(int(828,876 / 262,144 x 512) = 1,618, 2048, 4096) = 2048, then 118 // 5 = 23
    assert sp.max_running_requests(pool, 262144) == 23
    assert sp.max_running_requests(pool, 262144, slots_per_request=3) == 39  # --mamba-radix-cache-strategy no_buffer


def test_qwen35_122b_fp8_doubles_tokens_not_state():
    g = geom("qwen3.5-122b-a10b")
    pool = sp.size_pool(g, sp.kv_dtype("fp8_e4m3", g), 2, 18 * GIB)
    assert (pool.mamba_slots, pool.max_total_num_tokens) == (118, 10_185_228_288 // 6144) == (118, 1_657_752)


def test_llama_70b_cells():
    g = geom("llama-3.1-70b")
    bf16, fp8 = sp.kv_dtype("auto", g), sp.kv_dtype("fp8_e5m2", g)
    # 8 KV heads // tp x (128 + 128) x 80 layers x 2 B
    assert [sp.cell_bytes(g, bf16, tp) for tp in (1, 2, 4, 8)] == [327680, 163840, 81920, 40960]
    assert sp.cell_bytes(g, fp8, 8) == 1 * 256 * 80 * 1 == 20480
    assert sp.cell_bytes(g, sp.kv_dtype("mxfp8", g), 8) == 20480 + 20480 // 32 == 21120


def test_llama_70b_does_not_load_on_one_h200():
    # 141,107,412,992 B of weights on one GPU > 132,284,992,716.8 B for weights and cache: no figure, a reason
    result = plan(config("llama-3.1-70b"), LLAMA_70B_WEIGHTS, 1, H200_FREE_GIB, MFS)
    assert result["fits"] is False and "max_total_num_tokens" not in result
    assert "weights 131.4 GiB per GPU at tp=1, of the 123.2 GiB per GPU" in result["why"]


def test_llama_70b_on_two_h200():
    result = plan(config("llama-3.1-70b"), LLAMA_70B_WEIGHTS, 2, H200_FREE_GIB, MFS)
    # rest = 132,284,992,716.8 - 141,107,412,992 / 2 = 61,731,286,220.8; / 163,840 B = 376,777 tokens
    assert result["max_total_num_tokens"] == int(STATIC - LLAMA_70B_WEIGHTS / 2) // 163840 == 376_777
    fp8 = plan(config("llama-3.1-70b"), LLAMA_70B_WEIGHTS, 2, H200_FREE_GIB, MFS, kv_cache_dtype="fp8_e4m3")
    assert fp8["max_total_num_tokens"] == int(STATIC - LLAMA_70B_WEIGHTS / 2) // 81920 == 753_555


def test_deepseek_v3_mla_latent_is_not_per_head_nor_split_by_tp():
    g = geom("deepseek-v3")
    bf16 = sp.kv_dtype("auto", g)  # config torch_dtype bfloat16, no kv_cache_quant_algo: the KV is bf16
    # (kv_lora_rank 512 + qk_rope_head_dim 64) x 61 layers x 2 B = 70,272 at every tp
    assert (g.attention, g.mla_dim, g.kv_layers) == ("mla", 576, 61)
    assert {sp.cell_bytes(g, bf16, tp) for tp in (1, 2, 4, 8)} == {70272}
    assert sp.cell_bytes(g, sp.kv_dtype("fp8_e4m3", g), 8) == 576 * 61 == 35136
    # fp4: 35,136 // 2 = 17,568 data + (576 // 16 = 36) x 61 = 2,196 scale bytes
    assert sp.cell_bytes(g, sp.kv_dtype("nvfp4", g), 8) == 17568 + 2196 == 19764


def test_deepseek_v3_needs_eight_h200():
    four = plan(config("deepseek-v3"), DEEPSEEK_V3_WEIGHTS, 4, H200_FREE_GIB, MFS)
    assert four["fits"] is False and "160.3 GiB per GPU at tp=4" in four["why"]
    eight = plan(config("deepseek-v3"), DEEPSEEK_V3_WEIGHTS, 8, H200_FREE_GIB, MFS, kv_cache_dtype="fp8_e4m3")
    # rest = 132,284,992,716.8 - 86,073,340,969.1 = 46,211,651,747.7; / 35,136 B = 1,315,222 tokens
    assert eight["max_total_num_tokens"] == int(STATIC - DEEPSEEK_V3_WEIGHTS / 8) // 35136 == 1_315_222
    assert eight["max_running_requests"] == 4096  # int(1,315,222 / 163,840 x 512) = 4,110, clamped to 4,096


def test_nemotron_h_hybrid_layers_and_slot():
    g = geom("nemotron-3-nano-30b-a3b")
    # hybrid_override_pattern: 52 layers, 6 '*' (attention, KV), 23 'M' (mamba, state), 23 'E' (MoE, neither)
    assert (g.kv_layers, g.total_layers, g.state.layers) == (6, 52, 23)
    # 2 KV heads // tp x (128 + 128) x 6 x 2 B
    assert [sp.cell_bytes(g, sp.kv_dtype("auto", g), tp) for tp in (1, 2)] == [6144, 3072]
    # conv_dim = 64 x 64 + 2 x 8 x 128 = 6,144; per layer 6,144 x 3 x 2 B + 64 x 64 x 128 x 4 B = 2,134,016
    assert sp.state_slot_bytes(g.state, 1) == 23 * (6144 * 3 * 2 + 64 * 64 * 128 * 4) == 49_082_368


def test_nemotron_h_split_on_one_h200():
    result = plan(config("nemotron-3-nano-30b-a3b"), 63_000_000_000, 1, H200_FREE_GIB, MFS)
    rest = STATIC - 63e9  # 69,284,992,716.8; state budget x 0.9 / 1.9 = 32,819,207,076.4; / 49,082,368 = 668.7
    assert result["max_mamba_cache_size"] == 667  # floor((budget - slot) / slot)
    kv = int(rest - 668 * 49_082_368)  # 36,497,970,892
    assert result["max_total_num_tokens"] == kv // 6144 == 5_940_424
    assert result["max_running_requests"] == 667 // 5 == 133


def test_tp_that_does_not_divide_the_heads_is_refused():
    g = geom("qwen3.5-122b-a10b")
    with pytest.raises(sp.DoesNotFit, match="tp=3 does not divide the 32 attention heads"):
        sp.size_pool(g, sp.kv_dtype("bf16", g), 3, 18 * GIB)


def test_unmodelled_configs_are_named_not_guessed():
    with pytest.raises(sp.NotModelled, match="DSA"):
        sp.geometry({**config("deepseek-v3"), "architectures": ["DeepseekV32ForCausalLM"], "index_topk": 2048})
    with pytest.raises(sp.NotModelled, match="hybrid model type 'falcon_h1'"):
        sp.geometry(
            {
                "architectures": ["FalconH1ForCausalLM"],
                "model_type": "falcon_h1",
                "num_attention_heads": 8,
                "num_hidden_layers": 4,
                "hidden_size": 512,
                "mamba_num_heads": 16,
            }
        )
    with pytest.raises(sp.NotModelled, match="kv_cache_dtype 'mxfp4'"):
        sp.kv_dtype("mxfp4")


def test_auto_kv_dtype_follows_the_checkpoint():
    g = sp.geometry({**config("llama-3.1-70b"), "quantization_config": {"kv_cache_quant_algo": "FP8"}})
    assert sp.kv_dtype("auto", g).element_bytes == 1  # kv_cache_dtype.py: quant_config asks for an FP8 KV cache
    assert sp.kv_dtype("auto", geom("llama-3.1-70b")) == sp.KvDtype("bfloat16", 2)


def test_an_mla_config_outside_the_list_is_not_sized_as_mha():
    with pytest.raises(sp.NotModelled, match="MiniCPM3ForCausalLM: an MLA-style config"):
        sp.geometry({**config("deepseek-v3"), "architectures": ["MiniCPM3ForCausalLM"]})
