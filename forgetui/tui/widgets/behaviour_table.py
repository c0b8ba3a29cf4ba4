"""The behaviour metrics of a run (`forgetui analyze`'s table): metrics down, env × harness × model × step across."""

from __future__ import annotations

from textual.widgets import DataTable


class BehaviourTable(DataTable):
    """Mean and 95% bootstrap interval of each behaviour metric per group, as `forgetui analyze RUN` prints them."""

    BORDER_TITLE = "behaviour"
    DEFAULT_CSS = """
    BehaviourTable { border: round $primary-darken-1; }
    BehaviourTable:focus { border: round $accent; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self._shown: tuple | None = None

    def show_rows(self, header: list[str], rows: list[list[str]]) -> None:
        if (header, rows) == self._shown:
            return
        self._shown = (header, rows)
        self.clear(columns=True)
        self.add_columns(*header)
        self.add_rows(rows)
        self.border_subtitle = f"{len(header) - 1} group(s)" if len(header) > 1 else "no scored rollouts yet"
