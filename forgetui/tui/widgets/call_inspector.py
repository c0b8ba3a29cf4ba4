"""One call in full: its request conversation, the response, and the sampled tokens coloured by logprob."""

from __future__ import annotations

import math

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from forgetui.tui.conversation import Turn, request_turns, response_turns
from forgetui.tui.rows import CallDetail

MAX_TOKENS_SHOWN = 4000
MAX_TURN_CHARS = 20_000
ROLE_STYLES = {"system": "magenta", "user": "cyan", "assistant": "green", "model": "green", "tool": "yellow"}


def prob_rgb(logprob: float) -> tuple[int, int, int]:
    """Red (unlikely) through yellow to green (certain) for a token's probability; grey when unknown."""
    if logprob is None or math.isnan(logprob):
        return 128, 128, 128
    p = min(max(math.exp(logprob), 0.0), 1.0)
    return int(255 * min(1.0, 2 * (1 - p))), int(255 * min(1.0, 2 * p)), 60


def prob_colour(logprob: float) -> str:
    red, green, blue = prob_rgb(logprob)
    return f"rgb({red},{green},{blue})"


def token_text(ids: list[int], logprobs: list[float]) -> Text:
    """Token ids on a background coloured by probability; hovering is not needed, the legend explains."""
    text = Text()
    for i, tok in enumerate(ids[:MAX_TOKENS_SHOWN]):
        lp = logprobs[i] if i < len(logprobs) else math.nan
        text.append(f"{tok}", style=f"black on {prob_colour(lp)}")
        text.append(" ")
    if len(ids) > MAX_TOKENS_SHOWN:
        text.append(f"… {len(ids) - MAX_TOKENS_SHOWN} more", style="dim")
    return text


def turns_text(turns: list[Turn]) -> Text:
    text = Text()
    for n, (role, body) in enumerate(turns):
        if n:
            text.append("\n\n")
        base = role.split(" ", 1)[0]
        text.append(f"{role}\n", style=f"bold {ROLE_STYLES.get(base, 'white')}")
        if len(body) > MAX_TURN_CHARS:
            body = body[:MAX_TURN_CHARS] + f"\n… ({len(body) - MAX_TURN_CHARS} more characters)"
        text.append(body)
    return text


def header_text(d: CallDetail) -> Text:
    text = Text()
    text.append(d.call_id, style="bold")
    text.append(f"  {d.api}  {d.model}  ")
    text.append(d.status, style="green" if d.status == "ok" else "red")
    if d.finish_reason:
        text.append(f"  finish={d.finish_reason}")
    if d.latency_ms is not None:
        text.append(f"  {d.latency_ms:.0f} ms")
    # a call cancelled before the policy answered has no branch, parent or tokens: say what it has, not "None"
    parts = [f"rollout {d.rollout_id}"]
    parts += [f"{name} {value}" for name, value in (("branch", d.branch), ("extends_parent", d.extends_parent),
                                                    ("prefix_tokens", d.prefix_tokens)) if value is not None]
    if d.prompt_token_ids or d.completion_token_ids:
        parts += [f"prompt {len(d.prompt_token_ids)} tokens", f"completion {len(d.completion_token_ids)} tokens"]
    else:
        parts.append("no tokens recorded")
    text.append("\n" + "  ".join(parts), style="dim")
    if d.error:
        text.append(f"\n{d.error}", style="bold red")
    return text


def heading(title: str) -> Text:
    """A section heading as a styled *span*: a Text built with a style would pass it to everything appended."""
    text = Text()
    text.append(f"{title}\n", style="bold underline")
    return text


def legend() -> Text:
    text = Text()
    text.append("probability: ", style="dim")
    for p in (0.05, 0.25, 0.5, 0.75, 0.99):
        text.append(f" {p:g} ", style=f"black on {prob_colour(math.log(p))}")
        text.append(" ")
    return text


class CallInspector(VerticalScroll):
    """Sections for the header, request, response and tokens; filled by `show_call`."""

    BORDER_TITLE = "Call"
    DEFAULT_CSS = """
    CallInspector { border: round $primary-darken-1; height: 1fr; padding: 0 1; }
    CallInspector .section { margin-top: 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static(Text("select a call", style="dim"), id="call-header")
        yield Static("", id="call-request", classes="section")
        yield Static("", id="call-response", classes="section")
        yield Static("", id="call-tokens", classes="section")

    def show_call(self, detail: CallDetail) -> None:
        self.query_one("#call-header", Static).update(header_text(detail))
        req = heading("Request")
        req.append_text(turns_text(request_turns(detail.api, detail.request)))
        self.query_one("#call-request", Static).update(req)
        resp = heading("Response")
        resp.append_text(turns_text(response_turns(detail.response)) if detail.response is not None
                         else Text("(no response recorded)", style="dim"))
        self.query_one("#call-response", Static).update(resp)
        toks = heading("Completion tokens")
        if detail.completion_token_ids:
            toks.append_text(legend())
            toks.append("\n")
            toks.append_text(token_text(detail.completion_token_ids, detail.completion_logprobs))
        else:
            toks.append("(no token ids recorded: passthrough backend or failed call)", style="dim")
        self.query_one("#call-tokens", Static).update(toks)
        self.border_subtitle = detail.call_id
        self.scroll_home(animate=False)

    def show_message(self, message: str, style: str = "dim") -> None:
        """Empty the sections and show one line (no selection, or an error)."""
        self.query_one("#call-header", Static).update(Text(message, style=style))
        for sid in ("#call-request", "#call-response", "#call-tokens"):
            self.query_one(sid, Static).update("")
        self.border_subtitle = ""
