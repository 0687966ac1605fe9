"""`python -m sglang_labserver.launch_server [sglang flags]`: see the package docstring.

The order of a start follows sglang/srt/entrypoints/http_server.py `launch_server` (l.3125-3160):
parse, log `server_args` (with the API key: engine.py l.173-174, 1185), start the scheduler and
detokenizer children and load the "model", and only then bind the HTTP port and warm up; `/health`
answers 200 after the warm-up (http_server.py l.2572-2600).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang_labserver import __version__, engine, server_args
from sglang_labserver.engine import log

STARTUP_S = float(os.environ.get("SGLANG_LABSERVER_STARTUP_S", "3"))
# how many tokens a reasoning model thinks before it answers (unset: one short sentence); a long thought spends a
# small max_tokens before any answer, as a real reasoning model does
THINK_TOKENS = int(os.environ.get("SGLANG_LABSERVER_THINK_TOKENS", "0"))
DEFAULT_MAX_TOTAL_TOKENS = 780820  # the scenario's figure
DEFAULT_CONTEXT = 262144
# sglang/srt/utils/auth.py l.99-104: matched by prefix, so /health_generate is open too
OPEN_PREFIXES = ("/health", "/ready", "/metrics")


class State:
    def __init__(self, parsed: server_args.ParsedArgs, argv: list[str]):
        self.parsed = parsed
        self.args = parsed.args
        self.argv = argv
        self.started = time.time()
        self.ready = False
        self.draining = False
        self.inflight = 0
        self.lock = threading.Lock()
        self.requests_total = 0
        self.generated_total = 0
        self.tokenizer_manager: engine.TokenizerManager | None = None

    def arg(self, name: str, default=None):
        return getattr(self.args, name, default)

    @property
    def served_name(self) -> str:
        return self.arg("served_model_name") or self.arg("model_path")

    def server_info(self) -> dict:
        """utils/common.py l.3585-3591 build_server_info: resolved_dict() (api_key included, nothing
        redacted: server_args.py l.316-340) plus launch_command (server_args.py l.717-719)."""
        a = dict(self.parsed.resolved)
        max_tokens = int(a.get("max_total_tokens") or DEFAULT_MAX_TOTAL_TOKENS)
        info = dict(a)
        info.update(
            {
                "kv_cache_dtype": a.get("kv_cache_dtype") or "auto",
                "tp_size": int(a.get("tp_size") or 1),
                "max_total_num_tokens": max_tokens,
                "max_running_requests": int(a.get("max_running_requests") or 2048),
                "max_req_input_len": int(a.get("context_length") or DEFAULT_CONTEXT) - 1,
                "launch_command": self.parsed.launch_command,
                "version": __version__,
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


def reasoning(prompt: str) -> str:
    """What a reasoning model thinks before it answers (the part between <think> and </think>), THINK_TOKENS words
    long where that is set."""
    m = re.search(r"(-?\d+)\s*([*x\u00d7+\-/])\s*(-?\d+)", prompt)
    said = (
        f"The user asks for {m.group(0)}. I work it out step by step and state the result."
        if m
        else "There is no model behind this stand-in, so I say so."
    )
    words = said.split()
    if len(words) < THINK_TOKENS:
        words = words[:-1] + ["checking"] * (THINK_TOKENS - len(words)) + words[-1:]
    return " ".join(words)


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
            key = state.arg("api_key")
            if not key or self.path.split("?")[0].startswith(OPEN_PREFIXES):
                return True
            if self.headers.get("Authorization") == f"Bearer {key}":
                return True
            self._json(401, {"error": "Unauthorized"})
            return False

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"{}")

        def _serving(self) -> bool:
            # tokenizer_manager.py l.730: healthy while not gracefully exiting and the server is Up
            return state.ready and not state.draining

        # ------------------------------------------------------------ GET
        def do_GET(self):
            path = self.path.split("?")[0]
            if not self._authorized():
                return
            if path in ("/health", "/health_generate", "/ready"):
                if path != "/ready" and self._serving():
                    # http_server.py l.721-747: /health and /health_generate run a one-token generate
                    "".join(state.tokenizer_manager.generate(["ok"]))
                return self._empty(200 if self._serving() else 503)
            if path in ("/server_info", "/get_server_info"):
                return self._json(200, state.server_info())
            if path in ("/model_info", "/get_model_info"):
                return self._json(
                    200,
                    {
                        "model_path": state.arg("model_path"),
                        "served_model_name": state.served_name,
                        "tokenizer_path": state.arg("tokenizer_path") or state.arg("model_path"),
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
                                "max_model_len": int(state.arg("context_length") or DEFAULT_CONTEXT),
                            }
                        ],
                    },
                )
            if path == "/v1/loads":  # entrypoints/v1_loads.py get_loads: one DP rank, the core and queue sections
                load = {"timestamp": time.time(), "dp_rank": 0, "num_running_reqs": state.inflight}
                load |= {"num_waiting_reqs": 0, "max_total_num_tokens": state.server_info()["max_total_num_tokens"]}
                load |= {"token_usage": 0.0, "gen_throughput": 0.0, "cache_hit_rate": 0.0, "utilization": 0.0}
                load["queues"] = {"waiting": 0, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0}
                stamp = datetime.datetime.now(datetime.UTC).isoformat()
                answer = {"timestamp": stamp, "version": __version__, "accelerator": None, "num_accelerators": 1}
                return self._json(200, answer | {"loads": [load]})
            if path == "/metrics" and state.arg("enable_metrics"):
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
                tm = state.tokenizer_manager
                children = {p.name: p.pid for p in tm.children} if tm else {}
                return self._json(200, {"pid": os.getpid(), "env": env, "argv": state.argv, "children": children})
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

        def _tokens(self, prompt: str, max_tokens: int, ignore_eos: bool, think: bool = False) -> tuple:
            """The words to generate, how many of them at the front are reasoning, and whether max_tokens cut them."""
            thought = [w + " " for w in reasoning(prompt).split()] if think else []
            words = thought + [w + " " for w in answer(prompt).split()]
            if ignore_eos:
                words = (words * (max_tokens // max(len(words), 1) + 1))[:max_tokens]
            cut = bool(max_tokens) and len(words) > max_tokens and not ignore_eos
            words = words[:max_tokens] if max_tokens else words
            return words, min(len(thought), len(words)), cut

        def _stream(self, words: list[str]):
            """Each token's text, through the scheduler and detokenizer children."""
            for piece in state.tokenizer_manager.generate(words):
                with state.lock:
                    state.generated_total += 1
                yield piece

        def _openai(self, body: dict, prompt: str, chat: bool) -> None:
            max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 64)
            # entrypoints/openai/serving_chat.py: with --reasoning-parser the text before </think> is
            # returned apart, as reasoning_content (protocol.py l.762, 1296, 1357)
            think = chat and bool(state.arg("reasoning_parser")) and body.get("separate_reasoning", True)
            tokens, n_think, cut = self._tokens(prompt, max_tokens, bool(body.get("ignore_eos")), think)
            rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
            prompt_tokens = max(1, len(prompt.split()))
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(tokens),
                "total_tokens": prompt_tokens + len(tokens),
                "reasoning_tokens": n_think,
            }
            if body.get("stream"):
                self._sse_start()
                for i, tok in enumerate(self._stream(tokens)):
                    if chat:
                        delta = {"delta": {"reasoning_content" if i < n_think else "content": tok}}
                    else:
                        delta = {"text": tok}
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
                        "usage": usage,
                    }
                )
                return self._sse_done()
            pieces = list(self._stream(tokens))
            text = "".join(pieces[n_think:]).strip()
            # serving_chat.py: finish_reason "length" when max_tokens ran out; content None where the reasoning
            # parser left no answer text (the whole output was thought)
            choice = {"index": 0, "finish_reason": "length" if cut else "stop"}
            if chat:
                thought = "".join(pieces[:n_think]).strip() or None
                choice["message"] = {"role": "assistant", "content": text or None, "reasoning_content": thought}
            else:
                choice["text"] = text
            self._json(
                200,
                {
                    "id": rid,
                    "object": "chat.completion" if chat else "text_completion",
                    "created": int(time.time()),
                    "model": state.served_name,
                    "choices": [choice],
                    "usage": usage,
                },
            )

        def _generate(self, body: dict) -> None:
            params = body.get("sampling_params") or {}
            prompt = body.get("text") or ""
            if isinstance(prompt, list):
                prompt = prompt[0] if prompt else ""
            prompt_tokens = len(body.get("input_ids") or []) or max(1, len(str(prompt).split()))
            tokens, _, _ = self._tokens(
                str(prompt), int(params.get("max_new_tokens") or 128), bool(params.get("ignore_eos"))
            )
            rid = uuid.uuid4().hex
            start = time.time()
            if body.get("stream"):
                self._sse_start()
                text = ""
                for i, tok in enumerate(self._stream(tokens)):
                    text += tok
                    self._sse(
                        {
                            "text": text,
                            "output_ids": list(range(i + 1)),
                            "meta_info": {
                                "id": rid,
                                "finish_reason": None,
                                "prompt_tokens": prompt_tokens,
                                "completion_tokens": i + 1,
                                "cached_tokens": 0,
                            },
                        }
                    )
                return self._sse_done()
            text = "".join(self._stream(tokens))
            self._json(
                200,
                {
                    "text": text,
                    "output_ids": list(range(len(tokens))),
                    "meta_info": {
                        "id": rid,
                        "finish_reason": {"type": "length", "length": len(tokens)},
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": len(tokens),
                        "cached_tokens": 0,
                        "e2e_latency": round(time.time() - start, 4),
                    },
                },
            )

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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parsed = server_args.parse(argv)
    state = State(parsed, ["python", "-m", "sglang.launch_server", *argv])
    # engine.py l.173-174 and l.1185: the resolved arguments, api_key included, at INFO
    log(f"server_args={parsed.resolved}")

    # engine.py _launch_subprocesses (http_server.py l.3140-3152): the children first; until the
    # running phase installs its handler (tokenizer_manager.py l.2455) SIGTERM simply ends the parent
    state.tokenizer_manager = engine.TokenizerManager()
    log("Load weight begin. avail mem=139.31 GB (lab stand-in: no weights are loaded)")
    time.sleep(STARTUP_S / 2)
    info = state.server_info()
    log(f"KV Cache is allocated. dtype: {info['kv_cache_dtype']}, #tokens: {info['max_total_num_tokens']}")
    time.sleep(STARTUP_S / 2)

    # http_server.py l.3154-3160: the port is bound only now, after the model is loaded
    host, port = state.arg("host") or "127.0.0.1", int(state.arg("port") or 30000)
    # uvicorn binds an IPv6 host on an AF_INET6 socket (Config.bind_socket) and brackets it in this line
    Server.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server = Server((host, port), make_handler(state))
    shown = f"[{host}]" if ":" in host else host
    log(f"Uvicorn running on http://{shown}:{port} (Press CTRL+C to quit)")

    def warmup():  # http_server.py l.2572-2600 _wait_and_warmup
        "".join(state.tokenizer_manager.generate(["warmup"]))
        state.ready = True
        log("The server is fired up and ready to roll!")

    def sigterm(signum, frame):  # tokenizer_manager.py l.4066-4070
        log(f"SIGTERM received. signum={signum} frame={frame}. Draining requests and shutting down...")
        state.draining = True
        threading.Thread(target=drain, daemon=True).start()

    def drain():  # tokenizer_manager.py l.3508-3559 sigterm_watchdog
        logged = None
        while True:
            remaining = state.inflight
            if remaining != logged:
                log(f"Gracefully exiting... Remaining number of requests {remaining}.")
                logged = remaining
            if not remaining:
                break
            time.sleep(engine.DRAIN_POLL_S)
        state.tokenizer_manager.shutdown()
        server.shutdown()

    signal.signal(signal.SIGTERM, sigterm)
    threading.Thread(target=warmup, daemon=True).start()
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
