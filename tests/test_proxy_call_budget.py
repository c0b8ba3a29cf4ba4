"""run.max_calls: the proxy refuses a rollout's calls past its cap, in the caller's protocol, and records none of them."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from core.config import RunConfig
from core.errors import CallBudgetError

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def capped(live_proxy, script_file):
    """A run's proxy whose rollouts may make 2 model calls."""
    proxy = live_proxy(f"scripted:{script_file([{'text': 'one'}, {'text': 'two'}, {'text': 'three'}])}")
    proxy.sessions.max_calls = 2
    session = proxy.sessions.register("rollout-2")
    proxy.store.upsert_rollout({"rollout_id": "rollout-2", "run_id": "run-test", "status": "running", "token": session.token})
    return proxy, session


def test_openai_client_gets_a_403_after_the_cap_and_does_not_retry(capped):
    proxy, session = capped
    client = openai.OpenAI(base_url=f"{proxy.url}/r/{session.token}/v1", api_key="x", max_retries=2)
    answers = [client.chat.completions.create(model="m", messages=USER).choices[0].message.content for _ in range(2)]
    assert answers == ["one", "two"]
    with pytest.raises(openai.PermissionDeniedError, match="run.max_calls"):
        client.chat.completions.create(model="m", messages=USER)
    assert session.refused == 1 and session.calls == 2  # the SDK's retries skip a 403
    assert proxy.rows("SELECT seq, status FROM calls WHERE rollout_id = 'rollout-2' ORDER BY seq") == [(0, "ok"), (1, "ok")]


def test_anthropic_client_and_a_stream_get_the_protocols_error(capped):
    proxy, session = capped
    client = anthropic.Anthropic(base_url=f"{proxy.url}/r/{session.token}", api_key="x", max_retries=2)
    for _ in range(2):
        client.messages.create(model="m", max_tokens=16, messages=USER)
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        client.messages.create(model="m", max_tokens=16, messages=USER, stream=True)
    assert refused.value.body["type"] == "error" and refused.value.body["error"]["type"] == "permission_error"
    resp = httpx.post(f"{proxy.url}/r/{session.token}/v1/messages", json={"model": "m", "max_tokens": 16, "messages": USER})
    assert resp.status_code == 403 and "run.max_calls" in resp.json()["error"]["message"]
    assert session.refused == 2
    assert proxy.rows("SELECT count(*) FROM calls WHERE rollout_id = 'rollout-2'") == [(2,)]


def test_other_rollouts_and_uncapped_runs_are_not_affected(capped):
    proxy, _ = capped
    client = openai.OpenAI(base_url=f"{proxy.url}/r/{proxy.token}/v1", api_key="x", max_retries=0)
    for _ in range(3):  # rollout-1 was registered before the cap was set: no cap
        client.chat.completions.create(model="m", messages=USER)
    assert proxy.rows("SELECT count(*) FROM calls WHERE rollout_id = 'rollout-1'") == [(3,)]


def test_a_malformed_call_past_the_cap_is_still_a_400(capped):
    proxy, session = capped
    session.calls = 2
    resp = httpx.post(f"{proxy.url}/r/{session.token}/v1/chat/completions", content=b"{not json")
    assert resp.status_code == 400 and session.refused == 0  # what is wrong with the request comes first


def test_the_message_names_no_number_and_the_setting_validates():
    assert CallBudgetError().status == 403
    assert not any(ch.isdigit() for ch in str(CallBudgetError()))  # pi retries errors whose text holds 429/5xx-like numbers
    assert RunConfig.model_validate({"run": {"max_calls": 3}}).run.max_calls == 3
    with pytest.raises(ValueError):
        RunConfig.model_validate({"run": {"max_calls": 0}})
