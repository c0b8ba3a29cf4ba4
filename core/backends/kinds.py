"""The backend kinds, each declaring what it can do, in a registry a package can extend.

Callers ask a kind's declaration (can it be trained? does it sample token ids? is it a server the
training preflight must ask?) instead of comparing kind names or probing objects with `getattr`.
A built backend also carries `Capabilities` (`backend.capabilities`), which can depend on the model
(images: a vision-language model takes them, a text model does not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from core.errors import ConfigError
from core.plugins import Registry, import_target


@dataclass(frozen=True)
class Capabilities:
    """What a built backend does beyond generating: the proxy and the trainers ask these."""

    token_ids: bool = False  # streams the sampled token ids (a token backend)
    logprobs: bool = False  # one logprob per sampled token
    weight_reload: bool = False  # takes new weights in-process (`reload_weights(state_dict)`)
    adapters: bool = False  # samples with a LoRA adapter loaded by name on its server (`set_adapter`)
    images: bool = False  # prompts may carry images
    count_tokens: bool = False  # counts a request's prompt tokens itself (`count_tokens(request)`)


@dataclass(frozen=True)
class BackendKind:
    """One kind of backend as a spec names it (``name:TARGET``) and what it declares."""

    name: str
    build: str  # "package.module:function" building the backend from a PolicySpec (imported when used)
    usage: str  # how a spec of this kind is written, for errors and help
    path: Literal["token", "passthrough"]  # token: the proxy templates and sends ids; passthrough: text in, text out
    trainable: Literal["weights", "adapters", "no"]  # how a trainer updates it (its weights in-process, LoRA adapters on its server)
    tokenizer_from: Literal["target", "option", "option-or-tiny"]  # where the policy's tokenizer is named
    remote: bool = False  # a server: the training preflight asks it once for token ids and logprobs
    url_target: bool = False  # the target is a URL whose query string holds the options
    path_target: bool = False  # the target is a local path (shown by its file name only)
    config_relative: bool = False  # a relative target is a file beside the config that names it
    managed_target: bool = False  # a target that is not an http(s) URL names a model the project serves itself (vllm:MODEL)
    default_max_tokens: int = 2048  # the completion cap when neither the harness nor policy.max_tokens sets one
    why_not_trainable: str = ""  # the refusal a trainer gives for this kind

    def builder(self) -> Any:
        return import_target(self.build)


BUILTIN_KINDS = {
    "builtin": BackendKind(
        "builtin", "core.backends.builtin:from_spec", "builtin:MODEL", "token", "weights", "target",
        default_max_tokens=1024, path_target=True,
    ),
    "scripted": BackendKind(
        "scripted", "core.backends.scripted:from_spec", "scripted:FILE", "token", "no", "option-or-tiny",
        default_max_tokens=4096, path_target=True, config_relative=True,
        why_not_trainable="scripted:… replays fixed turns: it has no weights to train; use builtin:MODEL (a scripted policy is a teacher for SFT)",
    ),
    "vllm": BackendKind(
        "vllm", "core.backends.vllm:from_spec", "vllm:URL|MODEL", "token", "adapters", "option", remote=True, url_target=True,
        managed_target=True,
    ),
    "litellm": BackendKind(
        "litellm", "core.backends.litellm_backend:from_spec", "litellm:MODEL", "passthrough", "no", "option",
        why_not_trainable="is a passthrough: it returns text, not the token ids and logprobs training needs; use builtin:MODEL",
    ),
    "replay": BackendKind(
        "replay", "core.backends.replay:from_spec", "replay:ROLLOUT_ID", "token", "no", "option",
        why_not_trainable="replay:… serves a recorded rollout's answers: it has no weights to train",
    ),
}  # fmt: skip

# kinds: a third party registers a BackendKind object as an entry point in "forgetui.backends"
BACKENDS = Registry("forgetui.backends", "backend", BUILTIN_KINDS)


def backend_kind(name: str) -> BackendKind:
    """The declaration of backend kind `name`."""
    kind = BACKENDS.load(name)
    if not isinstance(kind, BackendKind):
        raise ConfigError(f"the backend entry point {name!r} must name a BackendKind, not {type(kind).__name__}")
    return kind

