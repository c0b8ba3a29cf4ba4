"""Who a call belongs to: the URL's token decides, keys never move a call, un-prefixed calls share one session."""

from __future__ import annotations

import httpx
import openai
import pytest

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
BODY = {"model": "m", "messages": USER}


@pytest.fixture
def two_rollouts(live_proxy, script_file):
    """A run's proxy with rollouts `rollout-1` (proxy.token) and `rollout-2` (returned token)."""
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    other = proxy.sessions.register("rollout-2")
    proxy.store.upsert_rollout({"rollout_id": "rollout-2", "run_id": "run-test", "status": "running", "token": other.token})
    return proxy, other.token


@pytest.mark.parametrize(
    "credentials",
    [
        {"headers": {"authorization": "Bearer {a}"}},
        {"headers": {"x-api-key": "{a}"}},
        {"headers": {"x-goog-api-key": "{a}"}},
        {"params": {"key": "{a}"}},
    ],
    ids=["bearer", "x-api-key", "x-goog-api-key", "query-key"],
)
def test_the_path_token_wins_over_a_conflicting_key(two_rollouts, credentials):
    proxy, token_b = two_rollouts
    kwargs = {k: {n: v.format(a=proxy.token) for n, v in d.items()} for k, d in credentials.items()}
    resp = httpx.post(f"{proxy.url}/r/{token_b}{CHAT}", json=BODY, **kwargs)
    assert resp.status_code == 200
    assert proxy.rows("SELECT rollout_id FROM calls") == [("rollout-2",)]


def test_a_key_alone_still_names_the_rollout(two_rollouts):
    proxy, token_b = two_rollouts
    resp = httpx.post(proxy.url + CHAT, json=BODY, headers={"authorization": f"Bearer {token_b}"})
    assert resp.status_code == 200
    assert proxy.rows("SELECT rollout_id FROM calls") == [("rollout-2",)]


def test_an_unknown_path_token_is_refused_whatever_the_key(two_rollouts):
    proxy, _ = two_rollouts
    resp = httpx.post(f"{proxy.url}/r/nobody{CHAT}", json=BODY, headers={"authorization": f"Bearer {proxy.token}"})
    assert resp.status_code == 401
    assert proxy.rows("SELECT count(*) FROM calls") == [(0,)]


def test_the_path_is_decoded_once(live_proxy, script_file):
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}", adhoc=True)
    assert httpx.post(f"{proxy.url}/r/a{CHAT}", json=BODY).status_code == 200
    assert httpx.post(f"{proxy.url}/r/%2561{CHAT}", json=BODY).status_code == 200  # the token is "%61", not "a"
    assert proxy.rows("SELECT rollout_id, seq FROM calls ORDER BY rollout_id") == [("run-test-%61", 0), ("run-test-a", 0)]
    # and a run's proxy refuses it rather than taking it for a registered token
    run = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    encoded = "".join(f"%{ord(c):02X}" for c in run.token)
    assert httpx.post(f"{run.url}/r/{encoded}{CHAT}", json=BODY).status_code == 200  # one decoding: the token itself
    twice = encoded.replace("%", "%25")
    assert httpx.post(f"{run.url}/r/{twice}{CHAT}", json=BODY).status_code == 401


def test_unprefixed_calls_share_one_default_session(live_proxy, script_file):
    proxy = live_proxy(f"scripted:{script_file([{'text': 'first answer'}, {'text': 'second'}])}", adhoc=True)
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-anything", max_retries=0)
    first = client.chat.completions.create(model="m", messages=USER).choices[0].message.content
    history = USER + [{"role": "assistant", "content": first}, {"role": "user", "content": "more"}]
    assert client.chat.completions.create(model="m", messages=history).choices[0].message.content == "second"
    rows = proxy.rows("SELECT rollout_id, seq, branch, extends_parent FROM calls ORDER BY seq")
    assert rows == [("run-test-default", 0, 0, False), ("run-test-default", 1, 0, True)]
    # /r/default/ is the same session
    assert httpx.post(f"{proxy.url}/r/default{CHAT}", json=BODY).status_code == 200
    assert proxy.rows("SELECT max(seq), count(DISTINCT rollout_id) FROM calls") == [(2, 1)]


def test_a_key_never_moves_an_adhoc_call_into_another_session(live_proxy, script_file):
    """On `forgetui proxy`, `/r/b/` with key `a` is a call of session `b`, even when `a` exists and `b` does not yet."""
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}", adhoc=True)
    assert httpx.post(f"{proxy.url}/r/a{CHAT}", json=BODY).status_code == 200
    for headers in ({"authorization": "Bearer a"}, {"x-api-key": "a"}):
        assert httpx.post(f"{proxy.url}/r/b{CHAT}", json=BODY, headers=headers).status_code == 200
    assert httpx.post(f"{proxy.url}/r/b{CHAT}", json=BODY, params={"key": "a"}).status_code == 200
    assert proxy.rows("SELECT rollout_id, count(*), max(seq) FROM calls GROUP BY 1 ORDER BY 1") == [("run-test-a", 1, 0), ("run-test-b", 3, 2)]


def test_a_token_that_is_not_utf8_is_refused_not_merged(live_proxy, script_file):
    """Issue 23 item 9: `/r/%FF/` and `/r/%FE/` both became the session `\\ufffd` (two identities, one rollout)."""
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}", adhoc=True)
    for token in ("%FF", "%FE", "a%C3"):
        resp = httpx.post(f"{proxy.url}/r/{token}{CHAT}", json=BODY)
        assert resp.status_code == 400, resp.text
        assert "not UTF-8" in resp.json()["error"]["message"]
    assert httpx.post(f"{proxy.url}/r/%C3%A9t%C3%A9{CHAT}", json=BODY).status_code == 200  # UTF-8 percent-encoded: "été"
    assert {s.token for s in proxy.sessions.all()} == {proxy.token, "été"}
    assert proxy.rows("SELECT count(*) FROM calls") == [(1,)]
