"""Serving capacity in terms people plan with, from what SGLang reports, and predictions for other
tensor-parallel sizes by SGLang 0.5.23's own sizing rules (provision/sglang_pool.py, docs/capacity.md).

`max_total_num_tokens` is the KV pool in tokens; sessions at a context size = tokens / size. A
prediction for another tp first moves each GPU's share of the weights (safetensors index
`metadata.total_size` / tp) in or out of the measured budget, then splits what is left as SGLang
does; a tp at which the model cannot load gets the reason, never a figure.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from provision import sglang_pool as sp
from provision.errors import UsageError
from provision.sglang_pool import GIB

DEFAULT_SESSION_TOKENS = (32768,)
# the tensor-parallel sizes a running server's capacity is predicted at
PREDICT_TP = (1, 2, 4, 8)


class CapacityUnknown(ValueError):
    """Why a container's capacity cannot be computed from what was read of it: one line, said as is."""


@dataclass
class SessionFit:
    tokens: int
    sessions: float

    @property
    def label(self) -> str:
        return f"{self.tokens // 1024}K" if self.tokens % 1024 == 0 else f"{self.tokens:,}-token"


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
    weights_bytes: int | None = None
    predictions: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

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


def parse_session_tokens(text: str, what: str = "--session-tokens") -> tuple[int, ...]:
    """`32768,131072`: the session sizes to count capacity in (--session-tokens, verify_session_tokens)."""
    try:
        sizes = tuple(int(part) for part in str(text).split(",") if part.strip())
    except ValueError:
        sizes = ()
    if not sizes or any(n < 1 for n in sizes):
        raise UsageError(f"{what} {text!r}: expected token counts separated by commas, e.g. 32768,131072")
    return sizes


def session_sizes(host_vars: dict[str, Any]) -> tuple[int, ...]:
    """The sizes a host's capacity is counted in: its verify_session_tokens, else 32768."""
    text = host_vars.get("verify_session_tokens")
    if not text:
        return DEFAULT_SESSION_TOKENS
    try:
        return parse_session_tokens(text, "verify_session_tokens")
    except UsageError as exc:
        raise CapacityUnknown(str(exc)) from None


def from_server(sglang: dict[str, Any], session_tokens: tuple[int, ...] = DEFAULT_SESSION_TOKENS) -> Capacity:
    """Capacity from what provision/checks/probe.py read of a container's server (the reading's `sglang`): its
    /server_info and /v1/models answers, the checkpoint's config.json and the total size in its safetensors
    index; predictions at PREDICT_TP. CapacityUnknown says why there is none."""
    info, models = sglang["server_info"], sglang["models"]
    if info["status"] != 200:
        raise CapacityUnknown(f"/server_info answered {info['status'] or 'nothing (no connection)'}")
    config = sglang.get("model_config")
    try:
        return compute(
            json.loads(info["body"]),
            json.loads(models["body"]),
            session_tokens=session_tokens,
            model_config=json.loads(config) if config else None,
            weights_bytes=sglang.get("weights_bytes"),
            predict_tp=PREDICT_TP,
        )
    except ValueError as exc:  # an answer that is not JSON, or a server that has not finished starting
        raise CapacityUnknown(str(exc)) from None
    except (KeyError, TypeError, AttributeError) as exc:  # JSON of another shape
        raise CapacityUnknown(f"{type(exc).__name__}: {exc}") from None


def effective_max_running_requests(server_info: dict[str, Any]) -> int | None:
    """The scheduler's own limit (internal_states[].effective_max_running_requests_per_dp, summed over DP
    ranks: it includes the hybrid state-pool cap), else the server argument `max_running_requests`."""
    ranks = [s.get("effective_max_running_requests_per_dp") for s in server_info.get("internal_states") or []]
    if ranks and all(isinstance(r, int) for r in ranks):
        return sum(ranks)
    value = server_info.get("max_running_requests")
    return int(value) if value else None


def compute(
    server_info: dict[str, Any],
    models: dict[str, Any] | None = None,
    session_tokens: tuple[int, ...] = DEFAULT_SESSION_TOKENS,
    model_config: dict[str, Any] | None = None,
    weights_bytes: int | None = None,
    predict_tp: tuple[int, ...] = (),
    predict_rest_gib_per_gpu: tuple[float, ...] = (),
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
    cap = Capacity(
        max_total_num_tokens=tokens,
        kv_cache_dtype=str(server_info.get("kv_cache_dtype") or "auto"),
        context_length=context,
        max_running_requests=effective_max_running_requests(server_info),
        tp_size=int(server_info.get("tp_size") or 1),
        full_context_sessions=tokens / context,
        sessions=[SessionFit(t, tokens / t) for t in session_tokens],
        weights_bytes=weights_bytes,
    )
    if model_config:
        _add_model_figures(cap, server_info, model_config, predict_tp, predict_rest_gib_per_gpu)
    return cap


def _add_model_figures(
    cap: Capacity, info: dict[str, Any], config: dict[str, Any], tps: tuple[int, ...], gibs: tuple[float, ...]
) -> None:
    try:
        geom = sp.geometry(config)
        dtype = sp.kv_dtype(cap.kv_cache_dtype, geom)
        cell = sp.cell_bytes(geom, dtype, cap.tp_size)
    except (sp.NotModelled, sp.DoesNotFit, KeyError) as exc:
        cap.notes.append(f"no per-token figures or predictions: {exc}")
        return
    cap.kv_bytes_per_token_per_gpu = cell
    cap.kv_pool_gib_per_gpu = round(cap.max_total_num_tokens * cell / GIB, 2)
    cap.model = {**asdict(geom), "kv_dtype": dtype.name}
    settings = PoolSettings.from_server_info(info)
    rest = measured_rest(geom, dtype, cap, info)
    if info.get("max_total_tokens"):
        cap.notes.append(
            "--max-total-tokens capped the pool, so the budget per GPU is unknown: no prediction for another tp"
        )
        tps = ()
    for tp in tps:
        if tp != cap.tp_size:
            cap.predictions.append(_predict_other_tp(geom, dtype, cap, rest, tp, settings))
    for gib in gibs:
        pred = predict(geom, dtype, cap.tp_size, gib * GIB, cap.context_length, settings)
        cap.predictions.append({"what": f"{gib:g} GiB of KV budget per GPU at tp={cap.tp_size}", **pred})
    if tps and cap.weights_bytes is None:
        cap.notes.append(
            "no model.safetensors.index.json: each GPU's share of the weights is unknown, "
            "so no prediction for another tp"
        )


@dataclass
class PoolSettings:
    """Server settings that change SGLang's split: --mamba-full-memory-ratio, --page-size, --max-running-requests."""

    mamba_ratio: float = sp.MAMBA_FULL_MEMORY_RATIO
    page_size: int = 1
    requested_max_running: int | None = None

    @classmethod
    def from_server_info(cls, info: dict[str, Any]) -> PoolSettings:
        return cls(
            mamba_ratio=float(info.get("mamba_full_memory_ratio") or sp.MAMBA_FULL_MEMORY_RATIO),
            page_size=int(info.get("page_size") or 1),
            requested_max_running=info.get("max_running_requests"),
        )


def measured_rest(geom: sp.Geometry, dtype: sp.KvDtype, cap: Capacity, info: dict[str, Any]) -> float:
    """The running server's KV budget per GPU (SGLang's `rest`): the KV pool, plus for a hybrid model its
    state pool, (max_mamba_cache_size + 1) slots, or r x the KV pool when the slot count is not reported."""
    kv = cap.max_total_num_tokens * (cap.kv_bytes_per_token_per_gpu or 0)
    if geom.state is None:
        return kv
    slots = info.get("max_mamba_cache_size")
    if isinstance(slots, int) and slots > 0:
        return kv + (slots + 1) * sp.state_slot_bytes(geom.state, cap.tp_size)
    return kv * (1 + PoolSettings.from_server_info(info).mamba_ratio)  # within one state slot


def predict(
    geom: sp.Geometry, dtype: sp.KvDtype, tp: int, rest: float, context: int, settings: PoolSettings | None = None
) -> dict[str, Any]:
    """What SGLang would start with on a budget `rest` per GPU, or why it would not start."""
    settings = settings or PoolSettings()
    try:
        pool = sp.size_pool(geom, dtype, tp, rest, settings.mamba_ratio, settings.page_size)
    except sp.DoesNotFit as exc:
        return {"tp": tp, "fits": False, "why": str(exc)}
    running = sp.max_running_requests(pool, context, settings.requested_max_running)
    return {
        "tp": tp,
        "fits": True,
        "max_total_num_tokens": pool.max_total_num_tokens,
        "full_context_sessions": round(pool.max_total_num_tokens / context, 2),
        "kv_bytes_per_token_per_gpu": pool.cell_bytes,
        "max_mamba_cache_size": pool.mamba_slots,
        "max_running_requests": running,
    }


def _predict_other_tp(
    geom: sp.Geometry, dtype: sp.KvDtype, cap: Capacity, rest: float, tp: int, settings: PoolSettings
) -> dict[str, Any]:
    what = f"tp={tp}, same GPUs and mem_fraction_static"
    if cap.weights_bytes is None:
        return {"what": what, "tp": tp, "fits": None, "why": "weights size unknown (no safetensors index)"}
    static = rest + cap.weights_bytes / cap.tp_size  # what mem_fraction_static leaves for weights and cache
    pred = predict(geom, dtype, tp, static - cap.weights_bytes / tp, cap.context_length, settings)
    return {"what": what, **_with_weights(pred, cap.weights_bytes / tp, static)}


def _with_weights(pred: dict[str, Any], share: float, static: float) -> dict[str, Any]:
    if not pred["fits"]:
        pred["why"] += (
            f" (weights {share / GIB:,.1f} GiB per GPU at tp={pred['tp']}, of the "
            f"{static / GIB:,.1f} GiB per GPU for weights and cache)"
        )
    return pred


def plan(
    config: dict[str, Any],
    weights_bytes: int,
    tp: int,
    free_gib_per_gpu: float,
    mem_fraction_static: float,
    kv_cache_dtype: str = "auto",
    context_len: int | None = None,
    settings: PoolSettings | None = None,
) -> dict[str, Any]:
    """Before any server runs: what SGLang would start with for this model on `tp` GPUs that each have
    `free_gib_per_gpu` free before loading (sglang_pool.rest_from_hardware)."""
    geom = sp.geometry(config)
    text = config.get("text_config") or config
    context = int(context_len or text.get("max_position_embeddings") or 0)
    rest = sp.rest_from_hardware(free_gib_per_gpu * GIB, weights_bytes, tp, mem_fraction_static)
    pred = predict(geom, sp.kv_dtype(kv_cache_dtype, geom), tp, rest, context, settings)
    return _with_weights(pred, weights_bytes / tp, free_gib_per_gpu * GIB * mem_fraction_static)


def load_json(text: str) -> dict[str, Any]:
    return json.loads(text) if text.strip() else {}


def fleet(workers: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """A gateway's capacity: its workers' (Capacity.to_dict, or None where unknown) summed, in the same terms as one
    server's sentence: tokens, sessions of the shared context length, sessions of each size. Workers of another
    context length are summed by tokens, and their sessions counted each at its own length."""
    known = [cap for _name, cap in sorted(workers.items()) if cap]
    unknown = sorted(name for name, cap in workers.items() if not cap)
    data: dict[str, Any] = {"workers": sorted(workers), "unknown": unknown, "max_total_num_tokens": 0}
    if not known:
        data["summary"] = f"unknown: no capacity for {', '.join(unknown) or 'any worker'}"
        return data
    data["max_total_num_tokens"] = sum(c["max_total_num_tokens"] for c in known)
    data["full_context_sessions"] = sum(c["full_context_sessions"] for c in known)
    contexts = sorted({c["context_length"] for c in known})
    context = f"{contexts[0]:,}-token" if len(contexts) == 1 else "full-context"
    parts = [f"{data['max_total_num_tokens']:,} tokens over {len(known)} worker(s)"]
    parts.append(f"{data['full_context_sessions']:.2f} × {context} sessions")
    parts += _fleet_session_sizes(known)
    data["summary"] = " ≈ ".join(parts) + (f" (no capacity for {', '.join(unknown)})" if unknown else "")
    return data


def _fleet_session_sizes(caps: list[dict[str, Any]]) -> list[str]:
    """'47.7 × 32K sessions' for each session size every worker counts in, summed over them."""
    said = []
    for i, fit in enumerate(caps[0]["sessions"]):
        if all(len(c["sessions"]) > i and c["sessions"][i]["tokens"] == fit["tokens"] for c in caps):
            total = sum(c["sessions"][i]["sessions"] for c in caps)
            said.append(f"{total:.1f} × {SessionFit(fit['tokens'], total).label} sessions")
    return said
