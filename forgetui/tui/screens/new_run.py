"""The new-run form: a base config file and the keys a run most often sets, pydantic's errors under each field;
Launch saves the TOML and returns its path."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from core.errors import ConfigError
from forgetui.tui.run_form import BASE, FIELDS, field_errors, save_config


def _wid(key: str) -> str:
    return key.replace(".", "-")


class NewRunScreen(ModalScreen[Path | None]):
    """Dismisses with the saved config's path (valid), or None (Esc)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel"), Binding("ctrl+s", "launch", "Launch", priority=True)]

    def __init__(self, configs_dir: Path, base: str = "") -> None:
        super().__init__()
        self.configs_dir = configs_dir
        self.base = base

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="new-run"):
            yield Static(Text("New run — empty fields keep the base config's value (or the default)", style="bold"))
            yield Label("base config file")
            yield Input(self.base, placeholder="examples/demo.toml (optional)", id=f"in-{BASE}")
            yield Static("", id=f"err-{BASE}", classes="form-error")
            for key, label, placeholder in FIELDS:
                yield Label(f"{label}  [dim]{key}[/]")
                yield Input(placeholder=placeholder, id=f"in-{_wid(key)}")
                yield Static("", id=f"err-{_wid(key)}", classes="form-error")
            with Horizontal(id="new-run-buttons"):
                yield Button("Launch (Ctrl+S)", id="launch", variant="primary")
                yield Button("Cancel (Esc)", id="cancel")

    def values(self) -> tuple[str, dict[str, str]]:
        base = self.query_one(f"#in-{BASE}", Input).value
        return base, {key: self.query_one(f"#in-{_wid(key)}", Input).value for key, _, _ in FIELDS}

    def show_errors(self, errors: dict[str, str]) -> None:
        for key in (BASE, *(k for k, _, _ in FIELDS)):
            self.query_one(f"#err-{_wid(key)}", Static).update(Text(errors.get(key, ""), style="bold red"))

    def action_launch(self) -> None:
        base, values = self.values()
        errors = field_errors(base, values)
        self.show_errors(errors)
        if errors:
            return
        try:
            path = save_config(base, values, self.configs_dir)
        except ConfigError as exc:  # e.g. a relative scripted file that resolves nowhere
            self.show_errors({BASE: str(exc)})
            return
        self.dismiss(path)

    @on(Button.Pressed, "#launch")
    def _launch(self) -> None:
        self.action_launch()

    @on(Button.Pressed, "#cancel")
    def _cancel(self) -> None:
        self.dismiss(None)
