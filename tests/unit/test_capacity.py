"""Capacity arithmetic: the scenario's figures, hybrid KV layers, predictions."""

import pytest

from provision.capacity import compute, kv_model_from_config

SCENARIO_INFO = {"max_total_num_tokens": 780820, "kv_cache_dtype": "bf16", "tp_size": 2, "max_running_requests": 48}
SCENARIO_MODELS = {"data": [{"id": "qwen3.5", "max_model_len": 262144}]}
QWEN35_TEXT = {
    "text_config": {"num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 256,
                    "full_attention_interval": 4, "hidden_size": 3072}
}  # fmt: skip


def test_scenario_figures_exactly():
    cap = compute(SCENARIO_INFO, SCENARIO_MODELS)
    assert cap.sentence() == "780,820 tokens ≈ 2.98 × 262,144-token sessions ≈ 23.8 × 32K sessions"
    assert cap.full_context_sessions == pytest.approx(2.9786, abs=1e-4)
    assert cap.sessions[0].sessions == pytest.approx(23.829, abs=1e-3)
    assert cap.max_running_requests == 48 and cap.kv_cache_dtype == "bf16"


def test_configurable_session_sizes():
    cap = compute(SCENARIO_INFO, SCENARIO_MODELS, session_tokens=(8192, 131072))
    assert [s.label for s in cap.sessions] == ["8K", "128K"]
    assert cap.sentence().endswith("≈ 95.3 × 8K sessions ≈ 6.0 × 128K sessions")


def test_hybrid_model_counts_only_full_attention_layers():
    kv = kv_model_from_config(QWEN35_TEXT)
    assert (kv.kv_layers, kv.hybrid) == (12, True)
    # 2 KV heads x (256 + 256) x 12 layers x 2 bytes: 24 KiB at tp=1, 12 KiB once tp >= 2 (heads replicated)
    assert kv.bytes_per_token_per_gpu(1, 2) == 24576
    assert kv.bytes_per_token_per_gpu(2, 2) == 12288 == kv.bytes_per_token_per_gpu(4, 2)


def test_kv_bytes_and_predictions_from_config():
    cap = compute(
        SCENARIO_INFO, SCENARIO_MODELS, model_config=QWEN35_TEXT, predict_tp=(1,), predict_kv_gib_per_gpu=(20,)
    )
    assert cap.kv_bytes_per_token_per_gpu == 12288
    assert cap.kv_pool_gib_per_gpu == pytest.approx(780820 * 12288 / 2**30, abs=0.01)
    tp1, gib20 = cap.predictions
    assert tp1["max_total_num_tokens"] == 780820 // 2  # twice the bytes per token per GPU
    assert gib20["max_total_num_tokens"] == 20 * 2**30 // 12288


def test_dense_model_uses_every_layer():
    kv = kv_model_from_config({"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                               "hidden_size": 4096})  # fmt: skip
    assert (kv.kv_layers, kv.hybrid, kv.head_dim) == (32, False, 128)


def test_missing_numbers_are_clear_errors():
    with pytest.raises(ValueError, match="max_total_num_tokens"):
        compute({}, SCENARIO_MODELS)
    with pytest.raises(ValueError, match="context length"):
        compute({"max_total_num_tokens": 5}, {"data": []})
