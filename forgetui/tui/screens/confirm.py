"""A yes/no (or several-choice) question as a modal; dismisses with the chosen button's id."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from forgetui.tui.widgets.key_footer import KeyFooter


class Confirm(ModalScreen[str | None]):
    """`choices`: (id, label) buttons, ←/→ move between them; Esc answers None. `focus`: the button focused
    first (Enter answers it) — a question whose yes destroys something focuses its safe answer."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel"), Binding("left", "app.focus_previous", show=False),
                Binding("right", "app.focus_next", show=False)]

    def __init__(self, question: str, choices: tuple[tuple[str, str], ...] = (("yes", "Yes"), ("no", "No")),
                 focus: str | None = None) -> None:
        super().__init__()
        self.question = question
        self.choices = choices
        self.focus_id = focus or choices[0][0]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.question, classes="dialog-text")
            with Horizontal(classes="dialog-buttons"):
                for cid, label in self.choices:
                    yield Button(label, id=cid, variant="primary" if cid == self.focus_id else "default")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one(f"#{self.focus_id}", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id)
