"""Who is calling: rollout tokens (from the URL or the API key) mapped to sessions."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.errors import AuthError, CallBudgetError
from core.tokens.continuation import Continuation

ADHOC_DEFAULT = "default"


@dataclass
class Session:
    """One rollout as the proxy sees it."""

    token: str
    rollout_id: str
    run_id: str
    attempt: int = 0  # the rollout's attempt this session serves (a retry gets a new session)
    calls: int = 0
    tools_hash: str | None = None  # of the tools the harness offered on its first call
    max_calls: int | None = None  # run.max_calls: model calls this rollout may make (None: no cap)
    refused: int = 0  # calls refused past that cap
    backend_failures: int = 0  # calls the model backend failed (unreachable, died, 5xx): the rollout's end is then not the policy's
    last_backend_failure: str = ""
    seed: int | None = None  # where this rollout's sampling draws start (`draw_seed`); None: unseeded
    _continuations: dict[int, Continuation] = field(default_factory=dict)

    def admit(self) -> None:
        """Raise CallBudgetError for a call past the rollout's cap (counted in `refused`)."""
        if self.max_calls is not None and self.calls >= self.max_calls:
            self.refused += 1
            raise CallBudgetError()

    def note_backend_failure(self, message: str) -> None:
        self.backend_failures += 1
        self.last_backend_failure = message

    def next_seq(self) -> int:
        seq = self.calls
        self.calls += 1
        return seq

    def call_seed(self, seq: int) -> int | None:
        """The sampler's seed for this rollout's call number `seq` (None when the rollout is unseeded)."""
        return None if self.seed is None else draw_seed(self.seed, str(seq))

    def turn_ids(self, call_id: str) -> list[int] | None:
        """The prompt + completion ids this session's continuation holds for an answered call, if any."""
        for cont in self._continuations.values():
            ids = cont.ids_of(call_id)
            if ids is not None:
                return ids
        return None

    def continuation_for(self, tokenizer: Any) -> Continuation:
        cont = self._continuations.get(id(tokenizer))
        if cont is None:
            cont = self._continuations[id(tokenizer)] = Continuation(tokenizer)
        return cont


def draw_seed(seed: int, *key: str) -> int:
    """A 63-bit seed for the sampler from a run's seed and what names one draw (task, step, sample, attempt, call):
    the same run seed gives the same draws for the same rollout, whatever order or batch the rollouts run in."""
    digest = hashlib.blake2b("\x1f".join((str(seed), *key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def new_token() -> str:
    return "ftr_" + secrets.token_urlsafe(18)


class SessionRegistry:
    """Tokens → sessions. In a run unknown tokens are refused; a standalone proxy makes ad-hoc sessions."""

    def __init__(self, run_id: str, adhoc: bool, on_new_adhoc: Callable[[Session], None] | None = None, max_calls: int | None = None,
                 seed: int | None = None) -> None:
        self.run_id = run_id
        self.seed = seed  # run.seed: each registered rollout's draws are seeded from it and the rollout's draw key
        self.adhoc = adhoc
        self.max_calls = max_calls  # every registered rollout's cap (run.max_calls)
        self.on_new_adhoc = on_new_adhoc
        self._by_token: dict[str, Session] = {}

    def register(self, rollout_id: str, token: str | None = None, attempt: int = 0, draw_key: tuple[str, ...] | None = None) -> Session:
        """A session for a rollout attempt; `draw_key` (task, step, sample, attempt) seeds its sampling when the run has a seed."""
        seed = None if self.seed is None or draw_key is None else draw_seed(self.seed, *draw_key)
        session = Session(token=token or new_token(), rollout_id=rollout_id, run_id=self.run_id, attempt=attempt, max_calls=self.max_calls, seed=seed)
        self._by_token[session.token] = session
        return session

    def unregister(self, token: str) -> None:
        self._by_token.pop(token, None)

    def get(self, token: str) -> Session | None:
        return self._by_token.get(token)

    def resolve(self, path_token: str | None, api_key: str | None) -> Session:
        """The session for a request. The URL's token decides; a key is looked at only when the URL has none.

        A key that names another rollout never moves a call there: `/r/b/` with key `a` is rollout `b`.
        Un-prefixed calls without a known key all share one session (`default`), as `/r/default/` does.
        """
        if path_token is not None:
            session = self._by_token.get(path_token)
            if session is not None:
                return session
        elif api_key and api_key in self._by_token:
            return self._by_token[api_key]
        if not self.adhoc:
            raise AuthError("unknown rollout token: use the base URL /r/<token>/ (or the token as API key) given to this rollout")
        name = path_token or ADHOC_DEFAULT
        session = self._by_token.get(name)
        if session is None:
            session = self.register(rollout_id=f"{self.run_id}-{name}", token=name)
            if self.on_new_adhoc is not None:
                self.on_new_adhoc(session)
        return session

    def all(self) -> list[Session]:
        """Every registered session (a copy: safe while others register)."""
        return list(self._by_token.values())

    def __len__(self) -> int:
        return len(self._by_token)
