"""The new-run form: a base config file and the keys a run most often sets; Launch checks the config exactly as
`forgetui run` will load it (and the env, harness and backend names), shows each error under its field, saves
the TOML and returns its path.

Typed fast (a paste, tmux, a quick typist), every character lands in the field it was typed in: Tab and Enter
move the focus at once (priority bindings, taken before the keys after them are delivered), and the first
field has the focus when the form opens."""

from __future__ import annotations

import logging
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from core.errors import ConfigError
from forgetui.tui.closing import dropped_once_closed
from forgetui.tui.run_form import BASE, FIELDS, KEYS, check, save_config
from forgetui.tui.widgets.form_field import FormField
from forgetui.tui.widgets.key_footer import KeyFooter

log = logging.getLogger(__name__)


def field_id(key: str) -> str:
    return key.replace(".", "-")


class NewRunScreen(ModalScreen[Path | None]):
    """Dismisses with the saved config's path (a run of it starts), or None (Esc)."""

    class Checked(Message):
        """The form's config checked on a worker: the saved file, or the errors per field."""

        def __init__(self, path: Path | None, errors: dict[str, str]) -> None:
            super().__init__()
            self.path = path
            self.errors = errors

    BINDINGS = [
        Binding("escape", "dismiss(None)", "Cancel"),
        Binding("ctrl+s", "launch", "Launch", priority=True),
        Binding("tab", "app.focus_next", "Next field", show=False, priority=True),
        Binding("shift+tab", "app.focus_previous", "Previous field", show=False, priority=True),
    ]
    AUTO_FOCUS = f"#in-{field_id(FIELDS[0][0])}"

    def __init__(self, configs_dir: Path, base: str = "") -> None:
        super().__init__()
        self.configs_dir = configs_dir
        self.base = base

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="new-run"):
            yield Static(Text("New run — empty fields keep the base config's value (or the default); "
                              "a paste of key=value lines fills the fields", style="bold"), id="new-run-title")
            for key, label, placeholder in (*FIELDS, (BASE, "base config file", "examples/demo.toml (optional)")):
                with Horizontal(classes="form-row"):
                    # the label, then its config key (hidden under 120 columns: the field's tooltip names it)
                    yield Label(label, classes="form-label", markup=False)
                    yield Label(key if key != BASE else "", classes="form-key", markup=False)
                    field = FormField(self.base if key == BASE else "", placeholder=placeholder, compact=True,
                                      id=f"in-{field_id(key)}")
                    field.tooltip = key if key != BASE else "a TOML run config the fields override"
                    yield field
                yield Static("", id=f"err-{field_id(key)}", classes="form-error")
            with Horizontal(id="new-run-buttons"):
                yield Button("Launch (Ctrl+S)", id="launch", variant="primary", compact=True)
                yield Button("Cancel (Esc)", id="cancel", compact=True)
        yield KeyFooter()

    def values(self) -> tuple[str, dict[str, str]]:
        base = self.query_one(f"#in-{BASE}", Input).value
        return base, {key: self.query_one(f"#in-{field_id(key)}", Input).value for key in KEYS}

    def show_errors(self, errors: dict[str, str]) -> None:
        for key in (BASE, *KEYS):
            shown = self.query_one(f"#err-{field_id(key)}", Static)
            shown.update(Text(errors.get(key, ""), style="bold red"))
            shown.set_class(key in errors, "-shown")
        first = next((key for key in (*KEYS, BASE) if key in errors), None)
        if first is not None:
            self.query_one(f"#in-{field_id(first)}", Input).focus()

    @on(Input.Submitted)
    def _next_field(self, event: Input.Submitted) -> None:
        event.stop()
        self.focus_next()

    @on(FormField.Pasted)
    def _pasted(self, message: FormField.Pasted) -> None:
        """Each `key=value` pasted into its field; a key the form does not show is said under the base file."""
        unknown = []
        for key, value in message.pairs:
            if key in KEYS:
                self.query_one(f"#in-{field_id(key)}", Input).value = value
            else:
                unknown.append(key)
        if unknown:
            self.show_errors({BASE: f"not fields of this form: {', '.join(unknown)} (set them in the base config file)"})

    def action_launch(self) -> None:
        self.query_one("#launch", Button).disabled = True
        self.check_config(*self.values())

    @work(thread=True, exclusive=True, group="check", exit_on_error=False)
    def check_config(self, base: str, values: dict[str, str]) -> None:
        """Load the config as `forgetui run` would (core's loader and registries: I/O and imports, off the loop)."""
        try:
            config, errors = check(base, values)
            if config is None:
                self.post_message(self.Checked(None, errors))
                return
            self.post_message(self.Checked(save_config(config, self.configs_dir), {}))
        except ConfigError as exc:
            self.post_message(self.Checked(None, {BASE: str(exc)}))
        except Exception as exc:
            log.exception("checking the new run's config failed")
            self.post_message(self.Checked(None, {BASE: f"{type(exc).__name__}: {exc}"}))

    @on(Checked)
    @dropped_once_closed
    def _checked(self, message: Checked) -> None:
        self.query_one("#launch", Button).disabled = False
        self.show_errors(message.errors)
        if message.path is not None:
            self.dismiss(message.path)

    @on(Button.Pressed, "#launch")
    def _launch(self) -> None:
        self.action_launch()

    @on(Button.Pressed, "#cancel")
    def _cancel(self) -> None:
        self.dismiss(None)
