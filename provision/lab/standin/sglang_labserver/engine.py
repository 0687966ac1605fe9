"""The stand-in's engine: a parent (tokenizer manager, in the HTTP server's process) and two
spawned children, a scheduler and a detokenizer, wired the way SGLang 0.5.23 wires them.

sglang/srt/entrypoints/http_server.py l.3140-3152 (`Engine._launch_subprocesses`): the
TokenizerManager runs in the main process, the Scheduler and the DetokenizerManager in
subprocesses (`mp.set_start_method("spawn")`, engine.py l.1995). A request goes parent ->
scheduler -> detokenizer -> parent, here over pipes (ZMQ in SGLang), so a request in flight
depends on both children: kill one and the request cannot finish.

Signals, as in the real release:
- the parent handles SIGTERM: it stops taking requests, drains the ones in flight, then asks the
  children to exit and exits (tokenizer_manager.py l.4066-4070 `sigterm_handler`, l.3508-3559
  `sigterm_watchdog`);
- the children install no SIGTERM handler, so a SIGTERM to the whole process group (systemd's
  default KillMode=control-group) kills them at once;
- the parent's SubprocessWatchdog polls the children every second and on a crashed child sends
  itself SIGQUIT, whose handler kills the whole process tree, the parent included
  (utils/watchdog.py l.166-221; tokenizer_manager.py l.4072-4081; utils/common.py l.2507-2552),
  so the requests in flight fail.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterator

from sglang_labserver import triton_launcher

TOKEN_DELAY_S = float(os.environ.get("SGLANG_LABSERVER_TOKEN_DELAY_S", "0.002"))
WATCHDOG_INTERVAL_S = 1.0  # utils/watchdog.py l.180
DRAIN_POLL_S = 0.2  # tokenizer_manager.py l.3538 polls every 5 s; the lab's stops are kept short


def log(msg: str) -> None:
    """SGLang's log format (server_args.py l.700-705: "[%(asctime)s] %(message)s")."""
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _set_process_name(name: str) -> None:
    """What `ps -o comm` shows (SGLang uses setproctitle: "sglang::scheduler")."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


# ------------------------------------------------------------------ children (no signal handlers)
def run_scheduler_process(requests, to_detokenizer) -> None:
    """A continuous-batching loop: each step emits one token for every running request."""
    _set_process_name("sglang::schedul")
    running: dict[str, list] = {}  # rid -> [words, next index]
    launcher = None
    try:
        while True:
            if not running:
                _scheduler_handle(requests.recv(), running)
            if launcher is None and running:  # the first forward pass launches the first Triton kernel
                launcher = _triton_launcher_or_quit()
            while requests.poll():
                _scheduler_handle(requests.recv(), running)
            step = []
            for rid, item in list(running.items()):
                words, i = item
                done = i + 1 >= len(words)
                step.append((rid, words[i] if words else "", done))
                item[1] += 1
                if done:
                    del running[rid]
            time.sleep(TOKEN_DELAY_S)  # one forward pass
            to_detokenizer.send(step)
    except (EOFError, SystemExit):  # the parent is gone, or asked us to exit (ShutdownReq)
        return


def _triton_launcher_or_quit():
    """The launcher Triton builds at its first kernel launch. A failure goes as in scheduler.py
    `run_scheduler_process`: the traceback is logged, then SIGQUIT to the parent, which kills the tree."""
    try:
        return triton_launcher.load()
    except Exception:
        log(f"Scheduler hit an exception: {traceback.format_exc()}")
        os.kill(os.getppid(), signal.SIGQUIT)
        raise SystemExit(1) from None


def _scheduler_handle(msg: tuple, running: dict) -> None:
    if msg[0] == "shutdown":
        raise SystemExit(0)
    if msg[0] == "generate":
        _, rid, words = msg
        running[rid] = [words, 0]


def run_detokenizer_process(from_scheduler, to_tokenizer) -> None:
    _set_process_name("sglang::detoken")
    try:
        while True:
            to_tokenizer.send(from_scheduler.recv())
    except EOFError:
        return


# ------------------------------------------------------------------ parent
class TokenizerManager:
    """The parent's side: starts the children, sends requests, routes their tokens back."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        req_recv, self._to_scheduler = ctx.Pipe(duplex=False)
        detok_recv, sched_send = ctx.Pipe(duplex=False)
        self._from_detokenizer, detok_send = ctx.Pipe(duplex=False)
        self.scheduler = ctx.Process(target=run_scheduler_process, args=(req_recv, sched_send), name="scheduler")
        self.detokenizer = ctx.Process(
            target=run_detokenizer_process, args=(detok_recv, detok_send), name="detokenizer"
        )
        self.scheduler.start()
        self.detokenizer.start()
        for end in (req_recv, sched_send, detok_recv, detok_send):
            end.close()  # the children hold these; a dead child then reads as EOF here
        self._send_lock = threading.Lock()
        self._streams: dict[str, queue.Queue] = {}
        self._streams_lock = threading.Lock()
        self.gracefully_exit = False
        self._watchdog_stop = threading.Event()
        threading.Thread(target=self._receive, daemon=True, name="detokenizer-receiver").start()
        threading.Thread(target=self._watchdog, daemon=True, name="subprocess-watchdog").start()
        signal.signal(signal.SIGQUIT, self._sigquit)

    @property
    def children(self) -> list:
        return [self.scheduler, self.detokenizer]

    @property
    def inflight(self) -> int:
        with self._streams_lock:
            return len(self._streams)

    def generate(self, words: list[str]) -> Iterator[str]:
        """Each token's text as the detokenizer sends it back (`rid_to_state` in SGLang)."""
        rid = uuid.uuid4().hex
        stream: queue.Queue = queue.Queue()
        with self._streams_lock:
            self._streams[rid] = stream
        try:
            with self._send_lock:
                self._to_scheduler.send(("generate", rid, list(words) or [""]))
            while True:
                text, done = stream.get()  # a dead child never answers: the watchdog ends us
                yield text
                if done:
                    return
        finally:
            with self._streams_lock:
                self._streams.pop(rid, None)

    def _receive(self) -> None:
        try:
            while True:
                for rid, text, done in self._from_detokenizer.recv():
                    with self._streams_lock:
                        stream = self._streams.get(rid)
                    if stream is not None:
                        stream.put((text, done))
        except (EOFError, OSError):  # a child died; the watchdog takes it from here
            return

    def _watchdog(self) -> None:
        """utils/watchdog.py l.203-221: a child that exited non-zero means SIGQUIT to ourselves."""
        while not self._watchdog_stop.wait(WATCHDOG_INTERVAL_S):
            for proc in self.children:
                if proc.is_alive() or proc.exitcode == 0:
                    continue
                log(
                    f"Subprocess {proc.name} (pid={proc.pid}) crashed with exit code {proc.exitcode}. "
                    "Triggering SIGQUIT for cleanup..."
                )
                os.kill(os.getpid(), signal.SIGQUIT)
                return

    def _sigquit(self, signum, frame) -> None:
        """tokenizer_manager.py l.4072-4081, then utils/common.py l.2548-2552: kill the tree, ourselves too."""
        log(f"SIGQUIT received. signum={signum}, frame={frame}. It usually means one child failed.")
        self._kill_children()
        os.kill(os.getpid(), signal.SIGKILL)

    def _kill_children(self) -> None:
        for proc in self.children:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)

    def shutdown(self) -> None:
        """tokenizer_manager.py l.3541-3559: stop the watchdog, ShutdownReq to the scheduler, reap."""
        self._watchdog_stop.set()
        try:
            with self._send_lock:
                self._to_scheduler.send(("shutdown",))
        except OSError:
            pass
        self.scheduler.join(timeout=10)
        self._to_scheduler.close()  # the detokenizer then reads EOF and exits
        self.detokenizer.join(timeout=10)
        self._kill_children()
