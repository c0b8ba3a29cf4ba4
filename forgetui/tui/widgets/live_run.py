"""A run going on inside the TUI (`forgetui run CONFIG` on a terminal): it runs the config on a worker thread
with its own event loop and shows run id and store, progress by outcome, throughput, the reward curve, the
rollouts and, at the end, the summary. Stopping it (q) cancels the run, whose cleanup removes every sandbox."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import ProgressBar, Static

from core.errors import ForgetuiError
from core.status import Tally
from forgetui.tui.closing import dropped_once_closed
from forgetui.tui.progress import ACTIVE, LiveState, RunProgress
from forgetui.tui.rows import RolloutRow, rollout_from_event
from forgetui.tui.source import RunSource, store_source
from forgetui.tui.widgets.reward_chart import RewardChart
from forgetui.tui.widgets.rollout_lines import RolloutLines

if TYPE_CHECKING:
    from core.config import RunConfig
    from core.eval.summary import RunSummary

log = logging.getLogger(__name__)

STATE_STYLES = {"starting": "yellow", "running": "cyan", "stopping": "bold yellow", "interrupted": "bold yellow",
                "done": "bold green", "failed": "bold red"}
RUN_ROLLOUTS_LIMIT = 5000  # rows the dashboard polls (its progress counts these)


def counts_text(tally: Tally, total: int) -> Text:
    """Finished of total, then each outcome in core's words (the rollouts list's outcome column says the same)."""
    text = Text(f"{tally.finished}/{max(total, tally.finished)} finished", style="bold")
    for label, n, style in (("passed", tally.passed, "green"), ("below threshold", tally.below_threshold, "yellow"),
                            ("harness failed", tally.harness_failed, "red"), ("timeout", tally.timeout, "yellow"),
                            ("infra error", tally.infra_error, "magenta")):
        text.append("  ·  ")
        text.append(f"{label} {n}", style=style if n else "dim")
    return text


def throughput_text(progress: RunProgress, now: float) -> Text:
    rpm = progress.rollouts_per_min(now)
    text = Text("throughput  ", style="bold")
    text.append("-" if rpm is None else f"{rpm:.1f}")
    text.append(" rollouts/min  ·  ")
    text.append("-" if progress.calls_per_s is None else f"{progress.calls_per_s:.2f}")
    text.append(" calls/s  ·  ")
    text.append("-" if progress.n_calls is None else str(progress.n_calls))
    text.append(" calls recorded")
    return text


def summary_text(summary: RunSummary) -> Text:
    """Counts, mean reward, pass@k and pass^k of a finished run."""
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    text = Text("Summary  ", style="bold underline")
    text.append(f"{summary.rollouts} rollouts: passed {summary.passed} · failed {summary.failed} · "
                f"timeouts {summary.timeouts} · infra errors {summary.infra_errors} · "
                f"mean reward {fmt(summary.mean_reward)}\n")
    text.append("pass@k  " + "  ".join(f"pass@{k} {fmt(v)}" for k, v in summary.pass_at_k.items()) + "\n")
    text.append("pass^k  " + "  ".join(f"pass^{k} {fmt(v)}" for k, v in summary.pass_hat_k.items()))
    if summary.extra.get("eval_json"):
        text.append(f"\neval report {summary.extra['eval_json']}", style="dim")
    text.append("\npress q to quit", style="dim")
    return text


class LiveRun(Vertical):
    """Runs `config` (or resumes `resume`); `state`, `exit_code` and `progress` say where it is."""

    DEFAULT_CSS = """
    LiveRun { height: 1fr; padding: 0 1; }
    LiveRun #live-header { height: auto; margin-bottom: 1; }
    LiveRun #live-progress { height: 1; }
    LiveRun #live-bar { width: 32; }
    LiveRun #live-counts { width: 1fr; margin-left: 2; }
    LiveRun #live-throughput { height: 1; margin-bottom: 1; }
    LiveRun #live-rollouts { min-height: 6; }
    LiveRun #live-summary { height: auto; max-height: 8; }
    """

    class Started(Message):
        """The engine planned the run: its id, store and number of rollouts (finished ones of a resume included)."""

        def __init__(self, run_id: str, store: Path, total: int) -> None:
            super().__init__()
            self.run_id = run_id
            self.store = store
            self.total = total

    class RolloutDone(Message):
        """The engine reports a rollout in a terminal status."""

        def __init__(self, row: RolloutRow) -> None:
            super().__init__()
            self.row = row

    class Polled(Message):
        """The run's rollouts and call count as its store has them now."""

        def __init__(self, run_id: str, rows: list[RolloutRow], n_calls: int) -> None:
            super().__init__()
            self.run_id = run_id
            self.rows = rows
            self.n_calls = n_calls

    class Ended(Message):
        """The run ended: `state` done (with its summary), interrupted or failed (with the error and exit code)."""

        def __init__(self, state: LiveState, code: int, summary: RunSummary | None = None, error: str | None = None) -> None:
            super().__init__()
            self.state = state
            self.code = code
            self.summary = summary
            self.error = error

    BORDER_TITLE = "Run"

    def __init__(self, config: RunConfig, *, resume: str | None = None, ks: list[int] | None = None,
                 poll_s: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config = config
        self.resume = resume
        self.ks = ks
        self.poll_s = poll_s
        self.state = LiveState.STARTING
        self.exit_code: int | None = None
        self.summary: RunSummary | None = None
        self.progress = RunProgress()
        self._lock = threading.Lock()
        self._handle: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None
        self._stop_requested = False
        self._done = threading.Event()

    @property
    def source(self) -> RunSource | None:
        return store_source(self.progress.store) if self.progress.store is not None else None

    def compose(self) -> ComposeResult:
        yield Static("", id="live-header")
        with Horizontal(id="live-progress"):
            yield ProgressBar(total=None, show_eta=False, id="live-bar")
            yield Static("", id="live-counts")
        yield Static(throughput_text(RunProgress(), 0.0), id="live-throughput")
        yield RewardChart(id="live-reward")
        yield RolloutLines(id="live-rollouts")
        yield Static("", id="live-summary")

    def on_mount(self) -> None:
        self.show_state("planning the rollouts, building images…")
        self.set_interval(self.poll_s, self._tick)
        self.run_engine()

    # -- the run
    @work(thread=True, exclusive=True, group="run", exit_on_error=False)
    async def run_engine(self) -> None:
        """Run the config on this worker thread's own loop (model loading, image builds and the eval plot
        block; the UI must not), posting Started / RolloutDone and then how it Ended."""
        from core.run import execute_run
        from core.store.query import store_for_run

        def on_start(run_id: str, total: int) -> None:
            self.post_message(self.Started(run_id, store_for_run(run_id), total))

        def on_event(event: Any) -> None:  # core.rollout.engine.RolloutEvent
            r = event.result
            self.post_message(self.RolloutDone(
                rollout_from_event(event.rollout_id, event.task_id, str(r.status), r.reward, r.passed, r.error)))

        task = asyncio.ensure_future(
            execute_run(self.config, resume=self.resume, on_event=on_event, on_start=on_start, ks=self.ks))
        with self._lock:
            self._handle = (asyncio.get_running_loop(), task)
            if self._stop_requested:
                task.cancel()
        try:
            summary = await task
        except asyncio.CancelledError:
            self.post_message(self.Ended(LiveState.INTERRUPTED, 130))
        except ForgetuiError as exc:
            self.post_message(self.Ended(LiveState.FAILED, 2, error=str(exc)))
        except Exception as exc:
            log.exception("the run failed")
            self.post_message(self.Ended(LiveState.FAILED, 1, error=f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(self.Ended(LiveState.DONE, 0, summary=summary))
        finally:
            with self._lock:
                self._handle = None
            self._done.set()

    def stop(self) -> None:
        """Cancel the run: execute_run's cleanup removes every sandbox and marks the run interrupted."""
        with self._lock:
            self._stop_requested = True
            handle = self._handle
        if handle is not None:
            loop, task = handle
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the run's loop already closed: it is over anyway
                pass
        if self.state in ACTIVE:
            self.state = LiveState.STOPPING
            self.show_state("stopping: removing the run's sandboxes…")

    async def wait_stopped(self, timeout_s: float = 120.0) -> None:
        """Until the run's cleanup finished (never leave sandboxes behind the UI)."""
        with self._lock:
            running = self._handle is not None
        if running:
            self.stop()
            await asyncio.to_thread(self._done.wait, timeout_s)

    @work(thread=True, exclusive=True, group="run-poll", exit_on_error=False)
    def poll(self, source: RunSource, run_id: str) -> None:
        """The run's rollouts and call count from its store (live endpoint while it runs); misses are retried."""
        try:
            rows = source.rollouts(run_id)[:RUN_ROLLOUTS_LIMIT]
            self.post_message(self.Polled(run_id, rows, source.count_calls(run_id)))
        except ForgetuiError as exc:  # e.g. the store between its writer closing and the file unlocking
            log.debug("polling run %s: %s", run_id, exc)
        except Exception:
            log.exception("polling run %s failed", run_id)

    def _tick(self) -> None:
        if self.state in ACTIVE | {LiveState.STOPPING}:
            self._poll()

    def _poll(self) -> None:
        source = self.source
        busy = any(w.group == "run-poll" and w.is_running for w in self.workers)
        if source is not None and self.progress.run_id and not busy:
            self.poll(source, self.progress.run_id)

    # -- what it shows
    def show_state(self, detail: str | None = None) -> None:
        """The header: run id, state, store path, and a detail line (an error, what to do next)."""
        p = self.progress
        text = Text("run ", style="bold")
        text.append(p.run_id or "(planning…)", style="bold cyan")
        text.append("  ")
        text.append(str(self.state), style=STATE_STYLES.get(self.state, ""))
        text.append(f"\nstore {p.store if p.store is not None else '-'}", style="dim")
        if detail:
            text.append(f"\n{detail}", style="red" if self.state == LiveState.FAILED else "yellow")
        self.query_one("#live-header", Static).update(text)
        self.border_subtitle = str(self.state)

    def _show_progress(self) -> None:
        p = self.progress
        tally = p.tally()
        if p.total or tally.finished:
            self.query_one("#live-bar", ProgressBar).update(total=max(p.total, tally.finished), progress=tally.finished)
        self.query_one("#live-counts", Static).update(counts_text(tally, p.total))
        self.query_one("#live-throughput", Static).update(throughput_text(p, time.monotonic()))
        self.query_one(RewardChart).show_curve(p.reward_curve(), p.rewards)
        self.query_one(RolloutLines).show_lines(p.sorted_rows())

    @on(Started)
    @dropped_once_closed
    def _started(self, message: Started) -> None:
        self.progress.start(message.run_id, message.store, message.total, time.monotonic())
        if self.state == LiveState.STARTING:
            self.state = LiveState.RUNNING
        self.show_state()
        self._show_progress()

    @on(RolloutDone)
    @dropped_once_closed
    def _rollout_done(self, message: RolloutDone) -> None:
        self.progress.apply_event(message.row)
        self._show_progress()

    @on(Polled)
    @dropped_once_closed
    def _polled(self, message: Polled) -> None:
        if message.run_id != self.progress.run_id:
            return
        self.progress.apply_rows(message.rows)
        self.progress.apply_calls(message.n_calls, time.monotonic())
        self._show_progress()

    @on(Ended)
    @dropped_once_closed
    def _ended(self, message: Ended) -> None:
        self.state, self.exit_code, self.summary = message.state, message.code, message.summary
        if message.state == LiveState.DONE and message.summary is not None:
            self.show_state()
            self.query_one("#live-summary", Static).update(summary_text(message.summary))
        elif message.state == LiveState.INTERRUPTED:
            self.show_state("every sandbox of the run was removed; `forgetui run --resume "
                            f"{self.progress.run_id or 'RUN_ID'}` finishes it")
        else:
            self.show_state((message.error or "the run failed") + "\npress q to quit")
        self._poll()  # the final rows, from the closed store
