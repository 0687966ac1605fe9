"""Capacity from a running server: the scenario's figures, per-token figures and tp predictions."""

import json

import pytest

from provision.capacity import CapacityUnknown, compute, effective_max_running_requests, from_server, session_sizes
from tests.unit import FIXTURES

SCENARIO_INFO = {"max_total_num_tokens": 780820, "kv_cache_dtype": "bf16", "tp_size": 2, "max_running_requests": 48}
SCENARIO_MODELS = {"data": [{"id": "qwen3.5", "max_model_len": 262144}]}
CONFIGS = FIXTURES / "model_configs"
QWEN35 = json.loads((CONFIGS / "qwen3.5-122b-a10b.json").read_text())
# Qwen3.5-122B-A10B in BF16 is "250 GB" on disk (olka-fi/Qwen3.5-122B-A10B-MXFP4 model card); its index's
# total_size was not available here, so this round figure stands in for it
QWEN35_WEIGHTS = 250_000_000_000


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


def test_scenario_per_token_figures():
    cap = compute(SCENARIO_INFO, SCENARIO_MODELS, model_config=QWEN35)
    # 1 KV head per GPU (2 // tp=2) x (256 + 256) x 12 full-attention layers x 2 B
    assert cap.kv_bytes_per_token_per_gpu == 12288
    assert cap.kv_pool_gib_per_gpu == round(780820 * 12288 / 2**30, 2) == 8.94
    assert (cap.model["kv_layers"], cap.model["total_layers"], cap.model["kv_dtype"]) == (12, 48, "bfloat16")


def test_scenario_predictions_move_the_weights_first():
    cap = compute(
        SCENARIO_INFO, SCENARIO_MODELS, model_config=QWEN35, weights_bytes=QWEN35_WEIGHTS, predict_tp=(1, 2, 4)
    )
    tp1, tp4 = cap.predictions  # tp=2 is the server itself
    # budget now: KV 780,820 x 12,288 = 9,594,716,160 B is 1/1.9 of rest (the state pool took 0.9/1.9),
    # so rest = 18,229,960,704; + 125e9 of weights = 143,229,960,704 B per GPU for weights and cache
    assert tp1["fits"] is False and "max_total_num_tokens" not in tp1
    assert "weights 232.8 GiB per GPU at tp=1, of the 133.4 GiB" in tp1["why"]
    # tp=4: rest = 143,229,960,704 - 62.5e9 = 80,729,960,704; slot 38,412,288 B (64 / 4 heads);
    # slots = floor(rest x 0.9 / 1.9 / slot) - 1 = 995 - 1 = 994; KV = rest - 995 x slot = 42,509,734,144 B
    assert (tp4["tp"], tp4["max_mamba_cache_size"]) == (4, 994)
    assert tp4["max_total_num_tokens"] == 42_509_734_144 // 12288 == 3_459_451
    # the server was started with --max-running-requests 48: SGLang keeps a set value unless the state pool
    # (994 // 5 = 198) or half the tokens is smaller
    assert tp4["max_running_requests"] == min(48, 994 // 5) == 48


def test_reported_state_slots_make_the_budget_exact():
    info = {**SCENARIO_INFO, "max_mamba_cache_size": 111}
    cap = compute(info, SCENARIO_MODELS, model_config=QWEN35, weights_bytes=QWEN35_WEIGHTS, predict_tp=(4,))
    # rest = 9,594,716,160 + (111 + 1) x 76,824,576 = 18,199,068,672 (not 1.9 x the KV pool)
    rest4 = 18_199_068_672 + QWEN35_WEIGHTS / 2 - QWEN35_WEIGHTS / 4
    slots = int((rest4 * 0.9 / 1.9 - 38_412_288) // 38_412_288)
    assert cap.predictions[0]["max_mamba_cache_size"] == slots
    assert cap.predictions[0]["max_total_num_tokens"] == int(rest4 - (slots + 1) * 38_412_288) // 12288


def test_no_prediction_without_the_weights_or_under_a_token_cap():
    no_index = compute(SCENARIO_INFO, SCENARIO_MODELS, model_config=QWEN35, predict_tp=(4,))
    assert no_index.predictions == [
        {
            "what": "tp=4, same GPUs and mem_fraction_static",
            "tp": 4,
            "fits": None,
            "why": "weights size unknown (no safetensors index)",
        }
    ]
    capped = compute(
        {**SCENARIO_INFO, "max_total_tokens": 780820},
        SCENARIO_MODELS,
        model_config=QWEN35,
        weights_bytes=QWEN35_WEIGHTS,
        predict_tp=(4,),
    )
    assert capped.predictions == [] and "--max-total-tokens" in capped.notes[0]


def test_budget_prediction_at_this_tp():
    cap = compute(SCENARIO_INFO, SCENARIO_MODELS, model_config=QWEN35, predict_rest_gib_per_gpu=(18,))
    # the 18 GiB split of tests/unit/provision/test_sglang_pool.py: 118 state slots, 828,876 tokens
    assert (cap.predictions[0]["max_mamba_cache_size"], cap.predictions[0]["max_total_num_tokens"]) == (118, 828876)


def test_effective_max_running_requests_prefers_the_scheduler():
    info = {"max_running_requests": None, "internal_states": [{"effective_max_running_requests_per_dp": 22}]}
    assert effective_max_running_requests(info) == 22
    assert effective_max_running_requests({"max_running_requests": 48}) == 48
    assert effective_max_running_requests({}) is None


def test_unmodelled_model_leaves_a_note_not_a_guess():
    falcon = {
        "architectures": ["FalconH1ForCausalLM"],
        "model_type": "falcon_h1",
        "num_attention_heads": 8,
        "num_hidden_layers": 4,
        "mamba_num_heads": 8,
    }
    cap = compute(SCENARIO_INFO, SCENARIO_MODELS, model_config=falcon)
    assert cap.kv_bytes_per_token_per_gpu is None and "falcon_h1" in cap.notes[0]


def test_missing_numbers_are_clear_errors():
    with pytest.raises(ValueError, match="max_total_num_tokens"):
        compute({}, SCENARIO_MODELS)
    with pytest.raises(ValueError, match="context length"):
        compute({"max_total_num_tokens": 5}, {"data": []})


def _server(info: dict | None = None, status: int = 200, models: dict | None = None) -> dict:
    """What provision/checks/probe.py reads of a container's server (its reading's `sglang`)."""
    return {
        "server_info": {"status": status, "body": json.dumps(info or SCENARIO_INFO)},
        "models": {"status": 200, "body": json.dumps(models or SCENARIO_MODELS)},
        "model_config": json.dumps(QWEN35),
        "weights_bytes": QWEN35_WEIGHTS,
    }


def test_capacity_from_what_the_probe_read_of_the_server():
    cap = from_server(_server(), session_tokens=(8192,))
    assert cap.sentence() == "780,820 tokens ≈ 2.98 × 262,144-token sessions ≈ 95.3 × 8K sessions"
    assert cap.kv_bytes_per_token_per_gpu == 12288
    assert [p["tp"] for p in cap.predictions] == [1, 4, 8], "predictions at PREDICT_TP other than its own tp=2"


def test_a_server_without_figures_says_why_in_one_line():
    with pytest.raises(CapacityUnknown, match=r"^/server_info answered nothing \(no connection\)$"):
        from_server(_server(status=0))
    with pytest.raises(CapacityUnknown, match=r"^/server_info answered 503$"):
        from_server(_server(status=503))
    with pytest.raises(CapacityUnknown, match="max_total_num_tokens"):
        from_server(_server(info={"tp_size": 1}))
    broken = {**_server(), "models": {"status": 500, "body": "Internal Server Error"}}
    with pytest.raises(CapacityUnknown, match="Expecting value"):
        from_server(broken)


def test_session_sizes_come_from_the_host_or_the_default():
    assert session_sizes({}) == (32768,)
    assert session_sizes({"verify_session_tokens": "8192,131072"}) == (8192, 131072)
    with pytest.raises(CapacityUnknown, match=r"^verify_session_tokens 'many': expected token counts"):
        session_sizes({"verify_session_tokens": "many"})
