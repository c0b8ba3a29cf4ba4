"""One vLLM server for a whole learning run: started once, its weights swapped to each stage's model.

A `vllm:MODEL` policy starts a server per run, and a learning run has five to eight of them (base eval, the SFT
eval, GRPO, the eval-split selection, the GRPO eval): on 2 CPU cores each start costs about 70 s, more than a
stage's sampling saves. Here the server starts once with the base model; before a stage samples, the stage's
checkpoint is reloaded into it in place (`core.train.vllm_sync.load_model`, a few seconds for SmolLM2-135M), and
the stage's policy is the running server (`vllm:http://127.0.0.1:PORT`). GRPO's trainer loads its starting weights
and its updates itself (`vllm_sync.check_server`, `push_full_weights`), so its stage asks for no load.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

from core.backends.vllm_server import ServerSettings, VllmServer
from core.models.resolve import resolve_model
from core.paths import sub
from core.train import vllm_sync

SERVED_NAME = "policy"  # the one name every stage's requests use: the weights behind it change, its weight version says which


class SharedVllm:
    """A vLLM server a learning run starts once (`start`), whose weights follow the stage about to sample (`spec`)."""

    def __init__(self, server: VllmServer, model: str) -> None:
        self.server = server
        self.model = model  # what the server was started with
        self.loaded: tuple[str, str] | None = None  # (model, the weight version this object set) the server holds
        self.reload_s: list[float] = []
        self._versions = itertools.count(1)
        if server.alive:
            self.loaded = (model, vllm_sync.server_weights(server.base_url) or vllm_sync.BASE_VERSION)

    @classmethod
    def for_model(cls, model: str, options: str, log_path: Path) -> SharedVllm:
        """Not started yet: a server for `model` with a plan's spec options (`max_model_len=8192&kv_cache=4`), logging to `log_path`."""
        settings = ServerSettings.from_options(model, {**dict(parse_qsl(options)), "model": SERVED_NAME, "log": str(log_path)})
        return cls(VllmServer(settings), model)

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def start(self) -> float:
        """Start the server with the base model; the seconds until it was ready."""
        self.server.start()
        self.loaded = (self.model, vllm_sync.BASE_VERSION)
        return self.server.startup_s or 0.0

    def stop(self) -> None:
        self.server.stop()

    def spec(self, model: str, *, load: bool = True) -> str:
        """The policy spec of the running server holding `model` (a built-in name or a checkpoint folder): its weights
        reloaded first unless it holds them already; `load=False` for a stage whose trainer loads its own (GRPO)."""
        if load and not self.holds(model):
            version = f"stage-{next(self._versions)}"
            scratch = sub("cache") / "vllm-weights" / f"learning-{id(self):x}-{version}"
            self.reload_s.append(vllm_sync.load_model(self.base_url, Path(str(resolve_model(model))), version, scratch))
            self.loaded = (model, version)
        return f"vllm:{self.base_url}?" + urlencode({"model": self.server.served_name, "tokenizer": model})

    def holds(self, model: str) -> bool:
        """Whether the server still holds `model` as this object loaded it (a trainer's sync in between replaces it)."""
        if self.loaded is None or self.loaded[0] != model:
            return False
        return vllm_sync.server_weights(self.base_url) == self.loaded[1]
