"""One rule for the default completion cap, and one constructor for the token policy (issue 46, item 2)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from core.backends.spec import PolicySpec
from core.config import RunConfig
from core.proxy.factory import default_max_tokens_for
from core.proxy.policy import TokenPolicy

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("backend", "configured", "expected"),
    [
        ("builtin:tiny?max_tokens=256", 32, 256),  # the spec's own option wins over policy.max_tokens
        ("builtin:tiny", 32, 32),  # then policy.max_tokens
        ("builtin:tiny", None, 64),  # then what the built-in model declares
        ("builtin:tiny-think", None, 64),
        ("builtin:smollm2-135m", None, 1024),  # then the kind's default
        ("vllm:http://127.0.0.1:9/v1?max_tokens=128", None, 128),
    ],
)
def test_default_cap_follows_one_rule(backend: str, configured: int | None, expected: int) -> None:
    assert default_max_tokens_for(PolicySpec.parse(backend), configured) == expected


def test_replay_and_verl_worker_take_the_specs_cap() -> None:
    """A run config's `?max_tokens=` reaches every place a policy is built (replay and veRL ignored it before)."""
    config = RunConfig.model_validate({"policy": {"backend": "builtin:tiny?max_tokens=256"}})
    assert default_max_tokens_for(config.policy.spec, config.policy.max_tokens) == 256


def test_the_token_policy_has_no_cap_of_its_own() -> None:
    """The cap comes from the rule above: TokenPolicy itself declares no default (it had 1024, a second rule)."""
    params = inspect.signature(TokenPolicy).parameters
    assert params["default_max_tokens"].default is params["parser"].default is inspect.Parameter.empty


def test_only_the_factory_constructs_a_token_policy() -> None:
    makers = []
    for path in sorted((REPO / "core").rglob("*.py")) + sorted((REPO / "forgetui").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "TokenPolicy":
                makers.append(str(path.relative_to(REPO)))
    assert makers == ["core/proxy/factory.py"], f"build token policies with core.proxy.factory.token_policy, not in {makers}"
