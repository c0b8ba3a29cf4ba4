"""The stores list: every store under FORGETUI_HOME with its runs and counts, newest first."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from forgetui.tui.data import StoreInfo
from forgetui.tui.messages import StoreSelected

MAX_RUNS_SHOWN = 3


def store_prompt(info: StoreInfo) -> Text:
    """Several lines: name and liveness, counts, then the newest runs."""
    text = Text()
    text.append("● " if info.live else "○ ", style="bold green" if info.live else "dim")
    text.append(info.name, style="bold")
    text.append(f"  {info.kind}", style="dim")
    if info.error:
        text.append(f"\n  {info.error}", style="red")
        return text
    text.append(f"\n  {info.n_rollouts} rollouts · {info.n_calls} calls", style="cyan")
    for run in info.runs[:MAX_RUNS_SHOWN]:
        colour = {"running": "yellow", "done": "green", "failed": "red"}.get(run.status, "white")
        text.append(f"\n  {run.run_id} ", style="")
        text.append(run.status, style=colour)
        text.append(f" {run.created_at}", style="dim")
    if len(info.runs) > MAX_RUNS_SHOWN:
        text.append(f"\n  … {len(info.runs) - MAX_RUNS_SHOWN} more runs", style="dim")
    return text


class StoreList(OptionList):
    """Stores as options (id = the store's path); Enter or a click selects one."""

    BORDER_TITLE = "Stores"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.stores: list[StoreInfo] = []

    def show_stores(self, stores: list[StoreInfo]) -> None:
        """Replace the options, keeping the highlighted store highlighted."""
        if stores == self.stores:
            return
        keep = None
        if self.highlighted is not None and self.option_count:
            keep = self.get_option_at_index(self.highlighted).id
        self.stores = list(stores)
        self.clear_options()
        self.add_options([Option(store_prompt(s), id=str(s.path)) for s in stores])
        if not stores:
            self.add_option(Option(Text("no stores yet under FORGETUI_HOME", style="dim"), disabled=True))
            return
        ids = [str(s.path) for s in stores]
        self.highlighted = ids.index(keep) if keep in ids else 0

    def highlight_store(self, path: Path) -> None:
        """Move the highlight to `path` (no selection message)."""
        ids = [str(s.path) for s in self.stores]
        if str(path) in ids:
            self.highlighted = ids.index(str(path))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id:
            self.post_message(StoreSelected(Path(event.option.id), chosen=True))
