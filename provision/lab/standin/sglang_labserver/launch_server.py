"""`python -m sglang_labserver.launch_server [sglang flags]`: see the package docstring."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources

STARTUP_S = float(os.environ.get("SGLANG_LABSERVER_STARTUP_S", "8"))
TOKEN_DELAY_S = float(os.environ.get("SGLANG_LABSERVER_TOKEN_DELAY_S", "0.002"))
DEFAULT_MAX_TOTAL_TOKENS = 780820  # the scenario's figure
DEFAULT_CONTEXT = 262144
OPEN_PATHS = ("/health", "/health_generate", "/ready", "/metrics")


def build_parser() -> argparse.ArgumentParser:
    flags = json.loads(resources.files("sglang_labserver").joinpath("flags.json").read_text())
    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    aliases = {"--model": "--model-path", "--tensor-parallel-size": "--tp-size"}
    groups: dict[str, list[str]] = {}
    for flag in flags:
        groups.setdefault(aliases.get(flag, flag), []).append(flag)
    for canonical, names in groups.items():
        names = sorted(names, key=lambda n: n != canonical)
        dest = canonical[2:].replace("-", "_")
        if flags[canonical if canonical in flags else names[0]]:
            parser.add_argument(*names, dest=dest, required=canonical == "--model-path")
        else:
            parser.add_argument(*names, dest=dest, action="store_true")
    return parser


class State:
    def __init__(self, args: argparse.Namespace, argv: list[str]):
        self.args = args
        self.argv = argv
        self.started = time.time()
        self.ready = False
        self.draining = False
        self.inflight = 0
        self.lock = threading.Lock()
        self.requests_total = 0
        self.generated_total = 0

    @property
    def served_name(self) -> str:
        return self.args.served_model_name or self.args.model_path

    def server_info(self) -> dict:
        a = vars(self.args).copy()
        max_tokens = int(a.get("max_total_tokens") or DEFAULT_MAX_TOTAL_TOKENS)
        kv = a.get("kv_cache_dtype") or "auto"
        # never echo secrets back (real SGLang keeps them out of logs as well)
        info = {k: (None if "api_key" in k else v) for k, v in a.items()}
        info.update(
            {
                "kv_cache_dtype": kv,
                "tp_size": int(a.get("tp_size") or 1),
                "max_total_num_tokens": max_tokens,
                "max_running_requests": int(a.get("max_running_requests") or 2048),
                "max_req_input_len": int(a.get("context_length") or DEFAULT_CONTEXT) - 1,
                "launch_command": " ".join(
                    "***" if i and self.argv[i - 1] == "--api-key" else a for i, a in enumerate(self.argv)
                ),
                "version": "0.5.23",
                "frontend": "python",
                "startup_time": round(self.started, 3),
                "internal_states": [
                    {
                        "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": max_tokens, "graph": 0.0},
                        "effective_max_running_requests_per_dp": int(a.get("max_running_requests") or 2048),
                        "last_gen_throughput": 0.0,
                        "world_size": int(a.get("tp_size") or 1),
                    }
                ],
                "lab_standin": True,
            }
        )
        return info


def answer(prompt: str) -> str:
    """The stand-in's whole 'model': arithmetic questions get the right answer."""
    m = re.search(r"(-?\d+)\s*([*x\u00d7+\-/])\s*(-?\d+)", prompt)
    if m:
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        value = {"*": a * b, "x": a * b, "\u00d7": a * b, "+": a + b, "-": a - b, "/": a / b if b else "undefined"}[op]
        return f"{a} {op} {b} = {value}. The answer is {value}."
    return "This is the provision lab's SGLang stand-in; it has no model."


def make_handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # one access line per request, like uvicorn
            sys.stderr.write(f"INFO:     {self.address_string()} - {fmt % args}\n")

        # ------------------------------------------------------------ helpers
        def _json(self, code: int, body) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _empty(self, code: int) -> None:
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _authorized(self) -> bool:
            key = state.args.api_key
            if not key or self.path.split("?")[0] in OPEN_PATHS:
                return True
            if self.headers.get("Authorization") == f"Bearer {key}":
                return True
            self._json(401, {"error": "Unauthorized"})
            return False

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"{}")

        def _serving(self) -> bool:
            return state.ready and not state.draining

        # ------------------------------------------------------------ GET
        def do_GET(self):
            path = self.path.split("?")[0]
            if not self._authorized():
                return
            if path in ("/health", "/health_generate", "/ready"):
                return self._empty(200 if self._serving() else 503)
            if path in ("/server_info", "/get_server_info"):
                return self._json(200, state.server_info())
            if path in ("/model_info", "/get_model_info"):
                return self._json(
                    200,
                    {
                        "model_path": state.args.model_path,
                        "served_model_name": state.served_name,
                        "tokenizer_path": state.args.tokenizer_path or state.args.model_path,
                        "is_generation": True,
                        "preferred_sampling_params": None,
                        "weight_version": "default",
                        "has_image_understanding": False,
                        "has_audio_understanding": False,
                        "model_type": "lab-standin",
                        "architectures": ["LabStandinForCausalLM"],
                    },
                )
            if path == "/v1/models":
                return self._json(
                    200,
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": state.served_name,
                                "object": "model",
                                "created": int(state.started),
                                "owned_by": "sglang",
                                "root": state.served_name,
                                "parent": None,
                                "max_model_len": int(state.args.context_length or DEFAULT_CONTEXT),
                            }
                        ],
                    },
                )
            if path == "/metrics" and state.args.enable_metrics:
                lines = [
                    f'sglang:num_requests_total{{model_name="{state.served_name}"}} {state.requests_total}',
                    f'sglang:generation_tokens_total{{model_name="{state.served_name}"}} {state.generated_total}',
                    f'sglang:num_running_reqs{{model_name="{state.served_name}"}} {state.inflight}',
                    f'sglang:max_total_num_tokens{{model_name="{state.served_name}"}} '
                    f"{state.server_info()['max_total_num_tokens']}",
                ]
                data = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if path == "/lab/env":
                env = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "SGLANG_", "CUDA_"))}
                return self._json(200, {"pid": os.getpid(), "env": env, "argv": state.argv})
            self._json(404, {"detail": "Not Found"})

        # ------------------------------------------------------------ POST
        def do_POST(self):
            path = self.path.split("?")[0]
            if not self._authorized():
                return
            if not self._serving():
                return self._json(503, {"error": "server is not ready"})
            try:
                body = self._body()
            except ValueError:
                return self._json(400, {"error": {"message": "request body is not valid JSON", "code": 400}})
            with state.lock:
                state.inflight += 1
                state.requests_total += 1
            try:
                if path == "/v1/chat/completions":
                    prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
                    return self._openai(body, prompt, chat=True)
                if path == "/v1/completions":
                    return self._openai(body, str(body.get("prompt", "")), chat=False)
                if path == "/generate":
                    return self._generate(body)
                self._json(404, {"detail": "Not Found"})
            finally:
                with state.lock:
                    state.inflight -= 1

        def _tokens(self, prompt: str, max_tokens: int, ignore_eos: bool) -> list[str]:
            text = answer(prompt)
            words = [w + " " for w in text.split()]
            if ignore_eos:
                words = (words * (max_tokens // max(len(words), 1) + 1))[:max_tokens]
            return words[:max_tokens] if max_tokens else words

        def _openai(self, body: dict, prompt: str, chat: bool) -> None:
            max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 64)
            tokens = self._tokens(prompt, max_tokens, bool(body.get("ignore_eos")))
            rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
            prompt_tokens = max(1, len(prompt.split()))
            if body.get("stream"):
                self._sse_start()
                for tok in tokens:
                    time.sleep(TOKEN_DELAY_S)
                    delta = {"delta": {"content": tok}} if chat else {"text": tok}
                    self._sse(
                        {
                            "id": rid,
                            "object": "chat.completion.chunk" if chat else "text_completion",
                            "model": state.served_name,
                            "choices": [{"index": 0, **delta, "finish_reason": None}],
                        }
                    )
                self._sse(
                    {
                        "id": rid,
                        "object": "chat.completion.chunk" if chat else "text_completion",
                        "model": state.served_name,
                        "choices": [{"index": 0, "finish_reason": "stop", **({"delta": {}} if chat else {"text": ""})}],
                        "usage": {
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": len(tokens),
                            "total_tokens": prompt_tokens + len(tokens),
                        },
                    }
                )
                return self._sse_done()
            time.sleep(TOKEN_DELAY_S * len(tokens))
            text = "".join(tokens).strip()
            choice = {"index": 0, "finish_reason": "stop"}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            state.generated_total += len(tokens)
            self._json(200, {
                "id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": state.served_name, "choices": [choice],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(tokens),
                          "total_tokens": prompt_tokens + len(tokens), "reasoning_tokens": 0},
            })  # fmt: skip

        def _generate(self, body: dict) -> None:
            params = body.get("sampling_params") or {}
            prompt = body.get("text") or ""
            if isinstance(prompt, list):
                prompt = prompt[0] if prompt else ""
            prompt_tokens = len(body.get("input_ids") or []) or max(1, len(str(prompt).split()))
            tokens = self._tokens(str(prompt), int(params.get("max_new_tokens") or 128), bool(params.get("ignore_eos")))
            rid = uuid.uuid4().hex
            start = time.time()
            if body.get("stream"):
                self._sse_start()
                text = ""
                for i, tok in enumerate(tokens):
                    time.sleep(TOKEN_DELAY_S)
                    text += tok
                    self._sse({"text": text, "output_ids": list(range(i + 1)), "meta_info": {
                        "id": rid, "finish_reason": None, "prompt_tokens": prompt_tokens,
                        "completion_tokens": i + 1, "cached_tokens": 0}})  # fmt: skip
                state.generated_total += len(tokens)
                return self._sse_done()
            time.sleep(TOKEN_DELAY_S * len(tokens))
            state.generated_total += len(tokens)
            self._json(200, {"text": "".join(tokens), "output_ids": list(range(len(tokens))), "meta_info": {
                "id": rid, "finish_reason": {"type": "length", "length": len(tokens)},
                "prompt_tokens": prompt_tokens, "completion_tokens": len(tokens), "cached_tokens": 0,
                "e2e_latency": round(time.time() - start, 4)}})  # fmt: skip

        def _sse_start(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

        def _sse(self, payload: dict) -> None:
            self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
            self.wfile.flush()

        def _sse_done(self) -> None:
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return Handler


class Server(ThreadingHTTPServer):
    # uvicorn listens with a backlog of 2048; http.server's 5 would make a burst of connections
    # wait for a SYN retransmit (1 s), which the benchmark would show as p99 TTFT
    request_queue_size = 2048
    daemon_threads = True


def config_args(argv: list[str]) -> list[str]:
    """`--config FILE` merges options from a YAML file, as SGLang does; the stand-in reads the JSON
    subset of YAML (what provision writes) and simple `key: value` lines."""
    if "--config" not in argv:
        return []
    path = argv[argv.index("--config") + 1]
    with open(path) as f:
        text = f.read()
    try:
        data = json.loads(text)
    except ValueError:
        data = {}
        for line in text.splitlines():
            if ":" in line and not line.lstrip().startswith("#"):
                key, value = line.split(":", 1)
                data[key.strip()] = value.strip().strip("'\"")
    out: list[str] = []
    for key, value in data.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value not in (False, None):
            out += [flag, str(value)]
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(config_args(argv) + argv)
    state = State(args, ["python", "-m", "sglang.launch_server", *argv])
    host, port = args.host or "127.0.0.1", int(args.port or 30000)
    server = Server((host, port), make_handler(state))
    log = lambda msg: print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {msg}", file=sys.stderr, flush=True)  # noqa: E731

    def startup():
        log("Load weight begin. avail mem=139.31 GB (lab stand-in: no weights are loaded)")
        time.sleep(STARTUP_S / 2)
        info = state.server_info()
        log(f"KV Cache is allocated. dtype: {info['kv_cache_dtype']}, #tokens: {info['max_total_num_tokens']}")
        time.sleep(STARTUP_S / 2)
        state.ready = True
        log("The server is fired up and ready to roll!")

    def drain(signum, frame):
        log("SIGTERM received. Draining requests and shutting down...")
        state.draining = True

        def wait_and_stop():
            while state.inflight:
                time.sleep(0.2)
            log("Gracefully exiting... Remaining number of requests 0.")
            server.shutdown()

        threading.Thread(target=wait_and_stop, daemon=True).start()

    signal.signal(signal.SIGTERM, drain)
    threading.Thread(target=startup, daemon=True).start()
    given = {k: v for k, v in vars(args).items() if v not in (None, False) and "api_key" not in k}
    log(f"server_args={given}")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
