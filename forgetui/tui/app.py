"""The forgetui TUI app: the home screen (runs, calls, rollouts, SQL) and the screens it opens; the app keeps what
outlives a screen — the runs catalog, the processes launched from here, the theme — and how to quit."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import on
from textual.app import App, SystemCommand
from textual.binding import Binding

from forgetui.tui import heap, launcher, settings
from forgetui.tui.messages import OpenCell, OpenRollout
from forgetui.tui.progress import ACTIVE, LiveState
from forgetui.tui.screens.cell_viewer import CellViewer
from forgetui.tui.screens.confirm import Confirm
from forgetui.tui.screens.home import HomeScreen
from forgetui.tui.screens.learning import LearningScreen
from forgetui.tui.screens.prompt import Prompt
from forgetui.tui.screens.rollout_screen import RolloutScreen
from forgetui.tui.source import RunCatalog
from forgetui.tui.widgets.live_run import LiveRun

if TYPE_CHECKING:
    from core.config import RunConfig

log = logging.getLogger(__name__)


class ForgetuiApp(App[int]):
    """Given `run_config`, it also runs it (on the home screen's Run tab); quitting stops it, which removes every
    sandbox. Runs launched from the New run form are processes of their own: quitting asks about them."""

    # the home screen's styles too: Textual loads a screen's CSS_PATH when it is pushed, not for the default screen
    CSS_PATH = ["app.tcss", "screens/home.tcss"]
    TITLE = "forgetui"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    BINDINGS = [Binding("question_mark", "help", "Keys", key_display="?")]

    def __init__(
        self,
        home: Path | None = None,
        *,
        refresh_s: float = 2.0,
        stores_refresh_s: float = 5.0,
        run_config: RunConfig | None = None,
        resume: str | None = None,
        ks: list[int] | None = None,
        run_refresh_s: float = 1.0,
        exit_delay_s: float = 0.8,
    ) -> None:
        super().__init__()
        self.catalog = RunCatalog(home)
        self.home_screen = HomeScreen(self.catalog, refresh_s=refresh_s, list_s=stores_refresh_s,
                                      run_config=run_config, resume=resume, ks=ks, poll_s=run_refresh_s)
        self.run_config = run_config
        self.exit_delay_s = exit_delay_s
        self.launched: list[launcher.Launched] = []  # runs started here: they outlive the TUI unless stopped
        self._stop_requested = False
        self.live_outcome: tuple[LiveState, str | None, int] | None = None  # how the live run ended, once it did
        self.settings = settings.Settings(self.catalog.home_path() / "tui" / "settings.json")
        if self.settings.theme in self.available_themes:
            self.theme = self.settings.theme

    @property
    def live(self) -> LiveRun | None:
        """The run going on inside the TUI, when `forgetui run` opened it."""
        return self.home_screen.live if self.run_config is not None else None

    def get_default_screen(self) -> HomeScreen:
        return self.home_screen

    @on(OpenRollout)
    def _open_rollout(self, message: OpenRollout) -> None:
        """A widget asked for a rollout: its screen opens on top of whatever is showing."""
        message.stop()
        self.push_screen(RolloutScreen(message.source, message.rollout_id))

    @on(OpenCell)
    def _open_cell(self, message: OpenCell) -> None:
        message.stop()
        self.push_screen(CellViewer(message.column, message.value))

    def on_mount(self) -> None:
        self.theme_changed_signal.subscribe(self, lambda theme: self.settings.save_theme(theme.name))
        self.call_after_refresh(heap.freeze_loaded)  # the imported modules and the first screen, out of every full collection

    # ------------------------------------------------------------------ quitting
    async def action_quit(self) -> None:
        """Quit; while a run is going inside the TUI, stop it first (its sandboxes are removed) and quit when it
        stopped. Runs launched from here as their own processes: ask whether they keep running."""
        live = self.live
        alive = [p for p in self.launched if p.alive()]
        if alive and (live is None or live.state not in ACTIVE):
            self.push_screen(Confirm(
                f"{len(alive)} run(s) launched here are still running. They can keep running headless "
                "(reopen forgetui later to watch them) or be stopped now (their sandboxes are removed).",
                (("keep", "Keep running and quit"), ("stop", "Stop them and quit"), ("cancel", "Cancel"))),
                self._quit_answer)
            return
        if live is not None and live.state in ACTIVE:
            run = live.progress.run_id
            self.push_screen(Confirm(
                f"The run {run or '(still planning)'} is going on in this window. Quitting stops it: its sandboxes "
                "are removed and it is marked interrupted"
                + (f" (`forgetui run --resume {run}` finishes it later)." if run else "."),
                (("stop", "Stop the run and quit"), ("cancel", "Keep watching")), focus="cancel"),
                self._stop_answer)
        elif live is not None and live.state == LiveState.STOPPING:
            self.notify("stopping the run: removing its sandboxes…", title="please wait")
        else:
            self.exit(live.exit_code if live is not None else None)

    def _stop_answer(self, answer: str | None) -> None:
        live = self.live
        if answer == "stop" and live is not None and live.state in ACTIVE:
            self._stop_requested = True
            live.stop()

    def _quit_answer(self, answer: str | None) -> None:
        if answer == "stop":
            for p in self.launched:
                launcher.terminate(p.pid)
        if answer in ("keep", "stop"):
            live = self.live
            self.exit(live.exit_code if live is not None else None)

    def action_help_quit(self) -> None:
        """Ctrl-C stops a live run (as q does); otherwise Textual's hint on how to quit."""
        live = self.live
        if live is not None and live.state in ACTIVE:
            self._stop_requested = True
            live.stop()
        elif live is not None and live.state == LiveState.STOPPING:
            self.notify("stopping the run: removing its sandboxes…", title="please wait")
        else:
            super().action_help_quit()

    @on(LiveRun.Ended)
    def _live_ended(self, message: LiveRun.Ended) -> None:
        """An interrupted run closes the app (q asked for it); a finished or failed one stays on screen until q,
        unless q was pressed while it ran."""
        live = self.live
        self.live_outcome = (message.state, live.progress.run_id if live is not None else None, message.code)
        if message.state == LiveState.INTERRUPTED or self._stop_requested:
            self.set_timer(self.exit_delay_s, lambda: self.exit(message.code))

    async def on_unmount(self) -> None:
        """Never leave a run going behind the UI: stop it and wait for its cleanup (sandboxes removed)."""
        live = self.live
        if live is not None:
            await live.wait_stopped()

    # ------------------------------------------------------------------ help and the palette
    def action_help(self) -> None:
        """Toggle Textual's keys panel: every binding of the focused widget and the screen."""
        if self.screen.query("HelpPanel"):
            self.action_hide_help_panel()
        else:
            self.action_show_help_panel()

    def get_system_commands(self, screen: Any) -> Any:
        yield from super().get_system_commands(screen)
        home = self.home_screen
        yield SystemCommand("Runs", "every run under FORGETUI_HOME", lambda: self._home("tab-runs"))
        yield SystemCommand("New run…", "a form over the run config; launches `forgetui run --no-ui`", home.action_new_run)
        yield SystemCommand("Resume the selected run", "`forgetui run --resume RUN_ID --no-ui`", home.action_resume)
        yield SystemCommand("Stop the selected run", "SIGTERM to its writer: sandboxes removed, run interrupted",
                            home.action_stop)
        yield SystemCommand("Delete the selected run", "its folder: store, logs, checkpoints (asks first)",
                            home.action_delete)
        yield SystemCommand("Compare runs", "mark run A, then the same on run B", home.action_compare)
        yield SystemCommand("gc", "remove sandboxes left behind by runs that died (asks first)", home.action_gc)
        yield SystemCommand("Open a store by path…", "any DuckDB store file", self.action_open_store)
        yield SystemCommand("SQL console", "read-only SQL on the run in focus", lambda: self._home("tab-sql"))
        yield SystemCommand("Learning runs", "a learning run's stages as they arrive", lambda: self.push_screen(LearningScreen(self.catalog.home_path())))

    def _home(self, tab: str) -> None:
        while self.screen is not self.home_screen and len(self.screen_stack) > 1:
            self.pop_screen()
        self.home_screen.action_show_tab(tab)

    def action_open_store(self) -> None:
        def opened(path: str | None) -> None:
            if not path:
                return
            store = Path(path).expanduser()
            if not store.is_file():
                self.notify(f"no store at {store}", severity="error", markup=False)
                return
            self._home("tab-calls")
            self.home_screen.open_store(store.resolve())

        self.push_screen(Prompt("Open a store file (DuckDB):", "~/.forgetui/stores/NAME.duckdb"), opened)


def run_tui(
    home: Path | None = None,
    *,
    run_config: RunConfig | None = None,
    resume: str | None = None,
    ks: list[int] | None = None,
) -> int:
    """Run the TUI until the user quits (on a run dashboard given a run config); logging goes to the Textual
    devtools console meanwhile. Returns the exit code: 0, 130 when a run was interrupted, 1/2 when it failed."""
    from textual.logging import TextualHandler

    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = [TextualHandler()]
    try:
        app = ForgetuiApp(home, run_config=run_config, resume=resume, ks=ks)
        result = app.run()
    finally:
        root.handlers = saved
    said = ended_line(app.live_outcome)
    if said:
        print(said, file=sys.stderr)  # the screen is gone: the shell keeps one line of what became of the run
    return int(result or app.return_code or 0)


def ended_line(outcome: tuple[LiveState, str | None, int] | None) -> str | None:
    """What the shell shows once the TUI of `forgetui run` closed: how the run ended and how to go on."""
    if outcome is None:
        return None
    state, run_id, code = outcome
    run = run_id or "(no run created)"
    if state == LiveState.INTERRUPTED:
        resume = f"; `forgetui run --resume {run_id}` finishes it" if run_id else ""
        return f"forgetui: run {run} stopped (exit {code}): its sandboxes were removed{resume}"
    if state == LiveState.DONE:
        return f"forgetui: run {run} done; `forgetui` lists it"
    return f"forgetui: run {run} failed (exit {code}); `forgetui` shows why on its Run screen"
