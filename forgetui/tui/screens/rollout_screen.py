"""One rollout: the conversation call by call (tools offered, tool calls, results), the verifier's output and
the sandbox log, the token view of its samples, and any call's raw JSON."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Header, OptionList, Static, TabbedContent, TabPane
from textual.widgets.option_list import Option

from core.errors import ForgetuiError
from forgetui.tui import heap
from forgetui.tui.closing import dropped_once_closed
from forgetui.tui.conversation import request_turns, response_turns, tools_offered
from forgetui.tui.rows import RolloutDetail, fmt, outcome_sentence
from forgetui.tui.source import RunSource, parse_json
from forgetui.tui.widgets.call_inspector import heading, turns_text
from forgetui.tui.widgets.call_json import CallJson
from forgetui.tui.widgets.key_footer import KeyFooter
from forgetui.tui.widgets.search_bar import SearchBar
from forgetui.tui.widgets.text_pane import TextPane
from forgetui.tui.widgets.token_view import TokenView, cursor_row

FIRST_CALLS = 40  # calls shown at first: laying out a 200-call conversation blocks the screen; `m` shows all


def conversation_text(calls: list[dict[str, Any]], limit: int | None = None) -> Text:
    """Each call's new turns (what the harness added since the previous call), its response, and the tools
    offered wherever they change; the first `limit` calls (all when None)."""
    text = Text()
    seen_turns, seen_tools = 0, None
    for n, call in enumerate(calls):
        request, response = parse_json(call.get("request")), parse_json(call.get("response"))
        turns = request_turns(str(call.get("api") or "chat"), request)
        flags = f"{call.get('api')} · {call.get('status')}" + (f" · branch {call['branch']}" if call.get("branch") is not None else "")
        if call.get("extends_parent") is False and n:
            flags += " · NEW BRANCH (history rewritten)"
        text.append_text(heading(f"call {n + 1}/{len(calls)}  ({flags})"))
        tools = tools_offered(request)
        if tools != seen_tools:
            text.append("tools offered: ", style="bold yellow")
            text.append(", ".join(name for name, _ in tools) or "none", style="yellow")
            text.append("\n")
            seen_tools = tools
        new = turns[seen_turns:] if call.get("extends_parent") and len(turns) >= seen_turns else turns
        text.append_text(turns_text(new))
        text.append("\n")
        reply = response_turns(response) if response is not None else []
        if reply:
            text.append_text(turns_text(reply))
        elif call.get("error"):
            text.append(f"error: {call['error']}", style="bold red")
        if call.get("tool_parse_error"):
            text.append(f"\ntool call not parsed: {call['tool_parse_error']}", style="red")
        text.append("\n\n")
        seen_turns = len(turns) + len(reply)
        if limit is not None and n + 1 >= limit and n + 1 < len(calls):
            text.append(f"… {len(calls) - n - 1} more calls: press m to show them all", style="bold yellow")
            break
    return text if calls else Text("no calls recorded", style="dim")


def verifier_text(d: RolloutDetail) -> Text:
    r = d.rollout
    text = Text()
    text.append(f"{r.get('rollout_id')}\n", style="bold cyan")
    text.append(f"{outcome_sentence(str(r.get('status') or ''), r.get('passed'))}\n", style="bold")
    text.append(f"reward {fmt(r.get('reward'), '.3g')} · attempt {r.get('attempt')} · step {r.get('step')} · "
                f"stored status {r.get('status')}, passed {r.get('passed')}\n", style="dim")
    if r.get("error"):
        text.append(f"{r['error']}\n", style="bold red")
    meta = r.get("meta") if isinstance(r.get("meta"), dict) else {}
    text.append_text(heading("Verifier"))
    text.append(str(meta.get("verifier") or "(no verifier output recorded)") + "\n\n")
    text.append_text(heading("Sandbox log"))
    text.append(d.log_text or "(no log saved for this rollout)")
    return text


class RolloutScreen(Screen):
    """Tabs: Conversation, Tokens, Verifier & log, Raw JSON. `b` shows the next branch's sample."""

    class Loaded(Message):
        """The rollout in full, its conversation and verifier texts already rendered (on the worker)."""

        def __init__(self, detail: RolloutDetail, conversation: Text, verifier: Text) -> None:
            super().__init__()
            self.detail = detail
            self.conversation = conversation
            self.verifier = verifier

    class Failed(Message):
        def __init__(self, error: str) -> None:
            super().__init__()
            self.error = error

    CSS_PATH = "rollout_screen.tcss"
    BINDINGS = [Binding("escape", "app.pop_screen", "Back", key_display="esc/q"),
                Binding("q", "app.pop_screen", "Back", show=False),
                Binding("left", "step_tab(-1)", "Tabs", key_display="←→"),
                Binding("right", "step_tab(1)", "Next tab", show=False),
                Binding("b", "next_branch", "Next branch"), Binding("m", "all_calls", "All calls"),
                Binding("slash", "search", "Search", key_display="/")]
    TABS = ("tab-conv", "tab-tokens", "tab-verifier", "tab-raw")
    AUTO_FOCUS = "#conv-scroll"

    def __init__(self, source: RunSource, rollout_id: str) -> None:
        super().__init__()
        self.source = source
        self.rollout_id = rollout_id
        self.detail: RolloutDetail | None = None
        self.branch = 0
        self.all_shown = False
        self.texts: dict[str, Text] = {}  # the conversation's and the verifier's text as rendered, unhighlighted
        self._match: dict[str, int] = {}  # per pane: where the last match shown starts (characters)

    def compose(self) -> ComposeResult:
        yield Header()
        with TabbedContent(id="rollout-tabs"):
            with TabPane("Conversation", id="tab-conv"), TextPane(id="conv-scroll"):
                yield Static(Text("loading…", style="dim"), id="conv")
            with TabPane("Tokens", id="tab-tokens"):
                yield TokenView(id="tokens")
            with TabPane("Verifier & log", id="tab-verifier"), TextPane(id="verifier-scroll"):
                yield Static("", id="verifier")
            with TabPane("Raw JSON", id="tab-raw"), Horizontal():
                yield OptionList(id="raw-calls")
                yield CallJson(id="raw-json")
        yield SearchBar(id="rollout-search")
        yield KeyFooter()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        d = self.detail
        if action == "next_branch":
            return d is not None and len(d.samples) > 1
        if action == "all_calls":
            return d is not None and len(d.calls) > FIRST_CALLS and not self.all_shown
        return True

    def action_step_tab(self, step: int) -> None:
        tabs = self.query_one("#rollout-tabs", TabbedContent)
        tabs.active = self.TABS[(self.TABS.index(tabs.active) + step) % len(self.TABS)]
        target = {"tab-conv": "#conv-scroll", "tab-tokens": "#tokens", "tab-verifier": "#verifier-scroll",
                  "tab-raw": "#raw-calls"}[tabs.active]
        self.query_one(target).focus()

    def on_unmount(self) -> None:
        heap.thaw()

    def on_mount(self) -> None:
        self.sub_title = self.rollout_id
        self.load()

    @work(thread=True, exclusive=True, group="rollout", exit_on_error=False)
    def load(self) -> None:
        try:
            with heap.loading():
                detail = self.source.rollout(self.rollout_id)
                # the texts too are built here, off the event loop: a 200-call conversation is a lot of parsing
                conversation = conversation_text(detail.calls, FIRST_CALLS)
            self.post_message(self.Loaded(detail, conversation, verifier_text(detail)))
        except ForgetuiError as exc:
            self.post_message(self.Failed(str(exc)))

    @on(Loaded)
    @dropped_once_closed
    def _loaded(self, message: Loaded) -> None:
        d = self.detail = message.detail
        self.texts = {"conv": message.conversation, "verifier": message.verifier}
        self.query_one("#conv", Static).update(message.conversation)
        self.query_one("#verifier", Static).update(message.verifier)
        self._show_branch()
        calls = self.query_one("#raw-calls", OptionList)
        calls.clear_options()
        calls.add_options([Option(f"{c.get('seq')} {c.get('api')} {c.get('status')}", id=str(i)) for i, c in enumerate(d.calls)])
        if d.calls:
            calls.highlighted = 0
            self.query_one(CallJson).show_call(d.calls[0])
        self.refresh_bindings()
        self.call_after_refresh(heap.freeze_loaded)

    def _show_branch(self) -> None:
        d = self.detail
        if d is None:
            return
        sample = d.samples[self.branch % len(d.samples)] if d.samples else None
        note = d.tokenizer_note
        if sample is not None and len(d.samples) > 1:
            note = f"branch {self.branch % len(d.samples) + 1}/{len(d.samples)} (b: next)" + (f" · {note}" if note else "")
        self.query_one(TokenView).show_sample(sample, note)

    def action_all_calls(self) -> None:
        if self.detail is not None and len(self.detail.calls) > FIRST_CALLS:
            self.all_shown = True
            self.texts["conv"] = conversation_text(self.detail.calls)
            self.query_one("#conv", Static).update(self.texts["conv"])
            self.refresh_bindings()

    # ------------------------------------------------------------------ search (/)
    def action_search(self) -> None:
        self.query_one(SearchBar).open()

    @on(SearchBar.Find)
    def _find(self, message: SearchBar.Find) -> None:
        """The next match of the query in the tab shown: the token text moves the cursor to it; the conversation
        and the verifier's log highlight every match and scroll to the next one."""
        bar, tab = self.query_one(SearchBar), self.query_one("#rollout-tabs", TabbedContent).active
        if tab == "tab-tokens":
            view = self.query_one(TokenView)
            found = view.find(message.query, view.cursor + 1 if view.sample is not None else 0)
            if found is not None:
                view.cursor = found[0]
            bar.border_title = f"token match {found[1]}/{found[2]}" if found else f"no “{message.query}” in the tokens"
            return
        pane = {"tab-conv": "conv", "tab-verifier": "verifier"}.get(tab)
        if pane is None or pane not in self.texts:
            bar.border_title = "search works on the conversation, the tokens and the verifier's log"
            return
        original = self.texts[pane]
        plain, needle = original.plain.lower(), message.query.lower()
        hits, at = [], plain.find(needle)
        while at >= 0:
            hits.append(at)
            at = plain.find(needle, at + 1)
        if not hits:
            bar.border_title = f"no “{message.query}” here"
            self.query_one(f"#{pane}", Static).update(original)
            return
        last = self._match.get(pane, -1)
        n = next((k for k, at in enumerate(hits) if at > last), 0)
        self._match[pane] = hits[n]
        shown = original.copy()
        for k, at in enumerate(hits):
            shown.stylize("black on yellow" if k == n else "black on rgb(120,120,0)", at, at + len(needle))
        body = self.query_one(f"#{pane}", Static)
        body.update(shown)
        bar.border_title = f"match {n + 1}/{len(hits)}"
        self.call_after_refresh(self._scroll_to_match, pane, hits[n] + len(needle))

    def _scroll_to_match(self, pane: str, end: int) -> None:
        body, scroll = self.query_one(f"#{pane}", Static), self.query_one(f"#{pane}-scroll", TextPane)
        row = cursor_row(self.texts[pane].plain, end, body.content_region.width)
        scroll.scroll_to(y=max(0, row - scroll.scrollable_content_region.height // 3), animate=False)

    @on(SearchBar.Closed)
    def _search_closed(self, message: SearchBar.Closed) -> None:
        self._match.clear()
        for pane, text in self.texts.items():
            self.query_one(f"#{pane}", Static).update(text)
        tab = self.query_one("#rollout-tabs", TabbedContent).active
        self.query_one({"tab-conv": "#conv-scroll", "tab-tokens": "#tokens", "tab-verifier": "#verifier-scroll",
                        "tab-raw": "#raw-calls"}[tab]).focus()

    def action_next_branch(self) -> None:
        self.branch += 1
        self._show_branch()

    @on(OptionList.OptionHighlighted, "#raw-calls")
    def _raw_call(self, event: OptionList.OptionHighlighted) -> None:
        if self.detail is not None and event.option.id is not None:
            self.query_one(CallJson).show_call(self.detail.calls[int(event.option.id)])

    @on(Failed)
    @dropped_once_closed
    def _failed(self, message: Failed) -> None:
        self.query_one("#conv", Static).update(Text(message.error, style="bold red"))
