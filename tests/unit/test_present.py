"""The console report: each capacity prediction shape prints, the ones that do not fit with their reason."""

import io

from rich.console import Console

from provision.capacity import compute
from provision.present import print_capacity
from provision.verify import VerifyReport
from tests.unit.test_capacity import QWEN35, QWEN35_WEIGHTS, SCENARIO_INFO, SCENARIO_MODELS


def printed(**predict) -> list[str]:
    cap = compute(SCENARIO_INFO, SCENARIO_MODELS, model_config=QWEN35, **predict)
    out = io.StringIO()
    print_capacity(Console(file=out, width=300), VerifyReport("lab", capacity={"sglang-01": cap.to_dict()}))
    return out.getvalue().splitlines()[2:]


def test_every_prediction_shape_prints_with_its_figures_or_its_reason():
    fits, too_big = printed(weights_bytes=QWEN35_WEIGHTS, predict_tp=(4, 1))
    assert fits == "  tp=4, same GPUs and mem_fraction_static: 3,459,451 tokens, 13.2 sessions"
    assert too_big.startswith("  tp=1, same GPUs and mem_fraction_static: does not fit: ")
    assert "weights 232.8 GiB per GPU at tp=1" in too_big
    assert printed(predict_tp=(4,)) == [
        "  tp=4, same GPUs and mem_fraction_static: cannot be predicted: weights size unknown (no safetensors index)"
    ]
