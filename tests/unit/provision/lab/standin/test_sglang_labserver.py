"""The lab's SGLang stand-in, run here on 127.0.0.1: it must do what real SGLang 0.5.23 does where
provision can notice (the key in /server_info and the log, the port bound only after loading,
a parent plus two children with SGLang's signal handling, open health paths, reasoning)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from provision.checks.support import SMOKE_EXPECT, SMOKE_MAX_TOKENS, SMOKE_QUESTION, smoke_failure
from provision.lab import wheelhouse
from tests.loaders import load_file, repo_file

CACHED_WHEELS = sorted((Path.home() / ".cache/provision/lab/wheels").glob(f"sglang-{wheelhouse.SGLANG_VERSION}-*.whl"))
KEY = "sk-standin-" + "9f4c21"
# The flags these tests use, for a machine without the sglang wheel cached (the lab packs all 559)
FEW_FLAGS = {
    "--model-path": True,
    "--model": True,
    "--host": True,
    "--port": True,
    "--tp-size": True,
    "--api-key": True,
    "--config": True,
    "--enable-metrics": False,
    "--reasoning-parser": True,
    "--served-model-name": True,
    "--tokenizer-path": True,
    "--context-length": True,
    "--kv-cache-dtype": True,
    "--max-total-tokens": True,
    "--max-running-requests": True,
}


@pytest.fixture(scope="module")
def standin_path(tmp_path_factory) -> Path:
    """A directory holding the stand-in package as the lab's wheel ships it (flags.json included)."""
    root = tmp_path_factory.mktemp("standin")
    if CACHED_WHEELS:
        wheel = wheelhouse.build_standin_wheel(CACHED_WHEELS[0], root / "wheel")
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(root / "site")
    else:
        shutil.copytree(wheelhouse.STANDIN_SRC, root / "site" / "sglang_labserver")
        (root / "site" / "sglang_labserver" / "flags.json").write_text(json.dumps(FEW_FLAGS))
        dist = root / "site" / f"sglang_labserver-{wheelhouse.SGLANG_VERSION}.dist-info"  # as the wheel installs it
        dist.mkdir()
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: sglang_labserver\nVersion: {wheelhouse.SGLANG_VERSION}\n"
        )
    return root / "site"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bound(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Standin:
    def __init__(
        self,
        site: Path,
        tmp: Path,
        *args: str,
        startup_s: float = 0.5,
        token_delay_s: float = 0.002,
        think_tokens: int = 0,
        env: dict | None = None,
    ):
        self.port = free_port()
        config = tmp / "secrets.yaml"
        config.write_text(json.dumps({"api-key": KEY}) + "\n")
        self.log = (tmp / "standin.log").open("w+")
        env = {
            **os.environ,
            "PYTHONPATH": str(site),
            "SGLANG_LABSERVER_STARTUP_S": str(startup_s),
            "SGLANG_LABSERVER_TOKEN_DELAY_S": str(token_delay_s),
            "SGLANG_LABSERVER_THINK_TOKENS": str(think_tokens),
            "TRITON_CACHE_DIR": str(tmp / "triton"),
            **(env or {}),
        }
        env.pop("CC", None)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sglang_labserver.launch_server",
                "--model-path",
                "/m",
                "--port",
                str(self.port),
                "--config",
                str(config),
                *args,
            ],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def call(self, path: str, body: dict | None = None, key: str | None = KEY, timeout: float = 30):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data, headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.call("/health", key=None, timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            assert self.proc.poll() is None, self.output()
            time.sleep(0.1)
        raise AssertionError("the stand-in never became ready: " + self.output())

    def children(self) -> dict[str, int]:
        return json.loads(self.call("/lab/env")[1])["children"]

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.log.close()


@pytest.fixture
def standin(standin_path, tmp_path):
    started: list[Standin] = []

    def start(*args: str, **kw) -> Standin:
        s = Standin(standin_path, tmp_path, *args, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def slow_request(s: Standin, tokens: int) -> tuple[threading.Thread, dict]:
    """A /generate of `tokens` tokens in a thread; the result lands in the returned dict."""
    result: dict = {}

    def go():
        try:
            code, body = s.call(
                "/generate", {"text": "go", "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}
            )
            result.update(code=code, tokens=json.loads(body)["meta_info"]["completion_tokens"])
        except OSError as e:  # connection reset, or closed without an answer
            result["error"] = repr(e)

    thread = threading.Thread(target=go)
    thread.start()
    if "--enable-metrics" in s.proc.args:  # on a busy machine the request may not have started yet: wait for it
        deadline = time.monotonic() + 30
        while "num_running_reqs" not in _running(s) and time.monotonic() < deadline:
            time.sleep(0.05)
    return thread, result


def _running(s: Standin) -> str:
    """The /metrics line of a server running a request, or ''."""
    lines = s.call("/metrics", key=None)[1].splitlines()
    return next((line for line in lines if line.startswith("sglang:num_running_reqs") and not line.endswith(" 0")), "")


def test_the_port_is_bound_only_after_the_children_are_up_and_the_model_loaded(standin):
    s = standin(startup_s=3)
    time.sleep(1.5)
    assert s.proc.poll() is None
    assert not bound(s.port), "real SGLang binds only after loading (http_server.py l.3125-3160)"
    assert "Load weight begin" in s.output()
    s.wait_ready()
    assert set(s.children()) == {"scheduler", "detokenizer"}
    assert all(alive(pid) for pid in s.children().values())


def test_the_key_from_the_config_file_is_in_server_info_and_in_the_startup_log(standin):
    s = standin("--tp-size", "2")
    s.wait_ready()
    info = json.loads(s.call("/server_info")[1])
    assert info["api_key"] == KEY
    assert info["launch_command"] == f"--api-key {KEY} --model-path /m --port {s.port} --tp-size 2"
    assert info["tp_size"] == 2 and info["max_total_num_tokens"] == 780820
    assert info["version"] == wheelhouse.SGLANG_VERSION  # the role's pin, through the wheel the lab builds
    assert f"'api_key': '{KEY}'" in s.output().split("server_args=", 1)[1].splitlines()[0]


def test_health_ready_and_metrics_need_no_key_and_the_rest_does(standin):
    s = standin("--enable-metrics")
    s.wait_ready()
    for path in ("/health", "/health_generate", "/ready", "/metrics"):
        assert s.call(path, key=None)[0] == 200, path
    assert s.call("/v1/models", key=None)[0] == 401
    assert s.call("/server_info", key="wrong")[0] == 401
    assert s.call("/v1/models")[0] == 200


def test_a_reasoning_parser_returns_reasoning_content_apart_from_the_answer(standin):
    s = standin("--reasoning-parser", "qwen3")
    s.wait_ready()
    body = {"messages": [{"role": "user", "content": "What is 7 * 13?"}], "max_tokens": 256}
    message = json.loads(s.call("/v1/chat/completions", body)[1])["choices"][0]["message"]
    assert "91" in message["content"] and "7 * 13" in message["reasoning_content"]
    plain = standin()
    plain.wait_ready()
    message = json.loads(plain.call("/v1/chat/completions", body)[1])["choices"][0]["message"]
    assert "91" in message["content"] and message["reasoning_content"] is None


def smoke(s: Standin) -> str | None:
    """verify's smoke check against the stand-in: the request the probe sends, judged as the check judges it."""
    body = {"messages": [{"role": "user", "content": SMOKE_QUESTION}], "max_tokens": SMOKE_MAX_TOKENS, "temperature": 0}
    return smoke_failure(*s.call("/v1/chat/completions", body), SMOKE_QUESTION, SMOKE_EXPECT)


def test_the_smoke_check_leaves_room_for_a_model_that_thinks_and_names_one_that_never_answers(standin):
    thinker = standin("--reasoning-parser", "qwen3", think_tokens=300, token_delay_s=0)
    never = standin("--reasoning-parser", "qwen3", think_tokens=SMOKE_MAX_TOKENS + 100, token_delay_s=0)
    thinker.wait_ready()
    never.wait_ready()
    assert smoke(thinker) is None
    assert smoke(never) == (
        "asked 'What is 7 * 13?', the model returned no answer (content None, finish_reason 'length'): it was still "
        f"reasoning when the {SMOKE_MAX_TOKENS} max_tokens ran out"
    )


def test_sigterm_to_the_parent_alone_drains_the_request_in_flight(standin):
    """systemd's KillMode=mixed: SIGTERM to the main process only."""
    s = standin("--enable-metrics", token_delay_s=0.01)
    s.wait_ready()
    children = s.children()
    thread, result = slow_request(s, 200)  # about 2 s, in flight when it returns
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert s.call("/health", key=None)[0] == 503, "a draining server is not healthy"
    thread.join(30)
    assert result == {"code": 200, "tokens": 200}, s.output()
    assert s.proc.wait(20) == 0
    assert not any(alive(pid) for pid in children.values())
    assert "Gracefully exiting... Remaining number of requests 0." in s.output()


def test_sigterm_to_the_whole_group_kills_the_children_and_the_request_in_flight(standin):
    """systemd's default KillMode=control-group: every process gets SIGTERM at once."""
    s = standin("--enable-metrics", token_delay_s=0.01)
    s.wait_ready()
    thread, result = slow_request(s, 500)  # about 5 s, in flight when it returns
    os.killpg(s.proc.pid, signal.SIGTERM)
    thread.join(30)
    assert "error" in result, f"the request should have failed: {result}"
    assert s.proc.wait(20) == -signal.SIGKILL, "the watchdog's SIGQUIT kills the whole tree, the parent too"
    assert "crashed with exit code -15" in s.output()


def test_a_dead_scheduler_takes_the_server_down(standin):
    s = standin()
    s.wait_ready()
    os.kill(s.children()["scheduler"], signal.SIGKILL)
    assert s.proc.wait(10) == -signal.SIGKILL
    assert not bound(s.port)


@pytest.mark.skipif(
    not CACHED_WHEELS, reason=f"the sglang {wheelhouse.SGLANG_VERSION} wheel is not in ~/.cache/provision/lab/wheels"
)
def test_config_merge_is_the_real_wheels(standin_path, tmp_path):
    """The stand-in's reproduction of --config against the wheel's own ConfigArgumentMerger."""
    with zipfile.ZipFile(CACHED_WHEELS[0]) as zf:
        source = zf.read("sglang/srt/utils/server_args_config_parser.py")
    (tmp_path / "real_merger.py").write_bytes(source)
    real = load_file(tmp_path / "real_merger.py")
    sys.path.insert(0, str(standin_path))
    try:
        from sglang_labserver import server_args
    finally:
        sys.path.remove(str(standin_path))
    config = tmp_path / "c.yaml"
    config.write_text("api-key: 'k: with colon'\nenable-metrics: true\nreasoning_parser: qwen3\ntp-size: 2\n")
    argv = ["--model-path", "/m", "--config", str(config), "--port", "1"]
    parser = server_args.build_parser()
    assert server_args.merge_config(argv, parser) == real.ConfigArgumentMerger(parser).merge_config_with_args(argv)


def test_an_ipv6_host_is_bound_on_an_ipv6_socket_and_logged_in_brackets(standin):
    """uvicorn (Config.bind_socket) binds a host with ':' on AF_INET6 and prints it as http://[::1]:port."""
    s = standin("--host", "::1")
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://[::1]:{s.port}/health", timeout=2) as r:
                assert r.status == 200
                break
        except OSError:
            assert s.proc.poll() is None and time.monotonic() < deadline, s.output()
            time.sleep(0.1)
    assert f"Uvicorn running on http://[::1]:{s.port} (Press CTRL+C to quit)" in s.output()
    assert not bound(s.port), "an IPv6 host must not be served on 127.0.0.1"


def test_the_first_generate_builds_the_launcher_with_cc_and_a_later_start_takes_it_from_the_cache(standin, tmp_path):
    """Triton's launcher (triton/runtime/build.py): compiled against Python.h at the first kernel launch, kept in
    TRITON_CACHE_DIR under the sha256 of its source, loaded from there by the next start."""
    first = standin()
    first.wait_ready()
    built = list((tmp_path / "triton").glob("*/cuda_utils*.so"))
    assert len(built) == 1, first.output()
    stamp = built[0].stat().st_mtime_ns
    first.stop()
    second = standin()
    second.wait_ready()
    assert built[0].stat().st_mtime_ns == stamp


def test_launchers_built_at_once_each_go_into_the_cache_whole(tmp_path, monkeypatch):
    """First kernel launches at once, each building the launcher (eight threads, five fresh caches): each writer puts
    its copy in place under a name of its own, as Triton's cache does, and none finds another's half-renamed file."""
    launcher = repo_file("provision/lab/standin/sglang_labserver/triton_launcher.py")
    launcher.sysconfig.get_config_vars()  # as in the server, read before any launch (its first read is not thread-safe)
    failures = []

    def first_launch(start):
        start.wait()
        try:
            launcher.load()
        except Exception as exc:  # a writer that lost the race
            failures.append(repr(exc))

    for round_ in range(5):
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / f"triton{round_}"))
        start = threading.Barrier(8)
        threads = [threading.Thread(target=first_launch, args=(start,)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        kept = [p.name for p in (tmp_path / f"triton{round_}").rglob("*") if p.is_file()]
        assert failures == [] and kept == ["cuda_utils" + launcher.sysconfig.get_config_var("EXT_SUFFIX")], kept


def test_without_a_c_compiler_the_first_generate_takes_the_server_down_naming_it(standin, tmp_path):
    """No $CC, no gcc or clang on PATH: Triton's RuntimeError in the scheduler, which SIGQUITs the parent."""
    bare = tmp_path / "bin"
    bare.mkdir()
    s = standin(env={"PATH": str(bare)})
    assert s.proc.wait(30) == -signal.SIGKILL
    out = s.output()
    assert "Scheduler hit an exception" in out
    assert (
        "RuntimeError: Failed to find C compiler. Please specify via CC environment variable or set "
        "triton.knobs.build.impl."
    ) in out
