"""The TUI on a big store: 10,000 rollouts / 100,000 calls, driven headless by Textual's test pilot.

    .venv/bin/python benchmarks/tui_scale.py [--rollouts 10000] [--calls 10] [--largest-calls 200] [--largest-system 20000]

The store is written once through the real writer (`core.store.writer.Store`, via tests/tui_stores.py) under
benchmarks/out/tui_scale/home and reused while its parameters match. One rollout is the largest: `--largest-calls`
calls on a `--largest-system`-token system prompt (a Claude Code-sized history). Reported, each from the
action to the screen showing its result:

* first paint (the app composed and drawn) and the Runs list filled;
* opening the run (Run screen with every rollout in its table);
* scrolling its rollouts table to the last row (End);
* opening the largest rollout (conversation and token view filled), then 50 cursor moves in its token view;
* the largest event-loop stall while doing all that: a task on the app's loop sleeps 5 ms at a time and
  records how late it wakes. Floor: no stall over 100 ms.
* each step's CPU seconds beside its wall time (`*_cpu_s`: the process's, every thread's; on a machine shared with
  other jobs the wall clock also waits for a core, the CPU seconds do not);
* the baseline: the same meter on an idle one-widget Textual app for 5 s before and after (on a machine
  shared with other jobs the loop wakes late for reasons of its own), and the load average.

The app runs headless (no terminal), so its rendering is Textual's compositor without the terminal's writes.
Exit code 0 when the floor holds.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

OUT = REPO / "benchmarks" / "out" / "tui_scale"
FLOOR_STALL_S = 0.100


def build(home: Path, args: argparse.Namespace) -> float:
    """The store (skipped when one with the same parameters is there); seconds it took."""
    from tests.tui_stores import build_run

    stamp = home / "params.json"
    params = {k: getattr(args, k) for k in ("rollouts", "calls", "largest_calls", "largest_system")}
    params["layout"] = 2  # compact prompts (parent + new ids), as the recorder stores them
    if stamp.exists() and json.loads(stamp.read_text()) == params:
        return 0.0
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    started = time.perf_counter()
    tasks = max(1, args.rollouts // 8)
    build_run(home, "big-run", tasks=tasks, samples=8, calls=args.calls, seed=1,
              progress=lambda n: n % 2000 == 0 and print(f"  {n} rollouts written", file=sys.stderr))
    build_run(home, "big-run", tasks=1, samples=1, calls=args.largest_calls, seed=2, system_tokens=args.largest_system,
              store_path=home / "runs" / "big-run" / "store.duckdb", task_prefix="largest")
    stamp.write_text(json.dumps(params))
    return time.perf_counter() - started


class StallMeter:
    """How late a 5 ms sleep on the app's loop wakes, at worst (and where)."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.phase = ""
        self.worst_phase = ""
        self.by_phase: dict[str, float] = {}
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.005)
            late = time.perf_counter() - t - 0.005
            self.by_phase[self.phase] = max(self.by_phase.get(self.phase, 0.0), late)
            if late > self.worst:
                self.worst, self.worst_phase = late, self.phase

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def until(pilot, cond, what: str, timeout: float = 600.0) -> None:
    deadline = time.perf_counter() + timeout
    while not cond():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"never reached: {what}")
        await pilot.pause(0.01)


async def baseline(seconds: float = 5.0) -> float:
    """The same meter on an idle one-widget Textual app, for `seconds`: how late the loop wakes on this
    machine with nothing to do (other processes' load), to read the stalls below against."""
    from textual.app import App
    from textual.widgets import Static

    class Idle(App):
        def compose(self):  # noqa: ANN202
            yield Static("idle")

    meter = StallMeter()
    async with Idle().run_test(size=(160, 48)) as pilot:
        meter.start()
        await pilot.pause(seconds)
        meter.stop()
    return meter.worst


async def drive(home: Path, rollouts: int) -> dict[str, float]:
    from forgetui.tui.app import ForgetuiApp
    from forgetui.tui.screens.rollout_screen import RolloutScreen
    from forgetui.tui.screens.run_screen import RunScreen
    from forgetui.tui.source import RunSource
    from forgetui.tui.widgets.rollout_lines import RolloutLines
    from forgetui.tui.widgets.runs_table import RunsTable
    from forgetui.tui.widgets.token_view import TokenView

    out: dict[str, float] = {}
    meter = StallMeter()
    started, started_cpu = time.perf_counter(), time.process_time()
    app = ForgetuiApp(refresh_s=3600, stores_refresh_s=3600)
    async with app.run_test(size=(160, 48)) as pilot:
        meter.start()
        out["first_paint_s"] = time.perf_counter() - started
        meter.phase = "runs list"
        await until(pilot, lambda: app.home_screen.query(RunsTable) and app.home_screen.query_one(RunsTable).row_count == 1,
                    "the runs list")
        out["runs_listed_s"] = time.perf_counter() - started
        out["start_cpu_s"] = time.process_time() - started_cpu

        meter.phase = "open run"
        t, c = time.perf_counter(), time.process_time()
        await app.push_screen(RunScreen(RunSource(home / "runs" / "big-run"), refresh_s=3600))
        lines = app.screen.query_one(RolloutLines)
        await until(pilot, lambda: lines.total == rollouts + 1, "the run's rollouts")
        await pilot.pause()
        out["open_run_s"] = time.perf_counter() - t
        out["open_run_cpu_s"] = time.process_time() - c

        meter.phase = "scroll to end"
        t, c = time.perf_counter(), time.process_time()
        lines.focus()
        await pilot.press("end")
        await until(pilot, lambda: lines.absolute_row == rollouts, "the last row")
        await pilot.pause()
        out["scroll_to_end_s"] = time.perf_counter() - t
        out["scroll_to_end_cpu_s"] = time.process_time() - c

        meter.phase = "open largest rollout"
        t, c = time.perf_counter(), time.process_time()
        await app.push_screen(RolloutScreen(RunSource(home / "runs" / "big-run"), "big-run/largest-0/0"))
        view = app.screen.query_one(TokenView)
        await until(pilot, lambda: view.sample is not None, "the largest rollout")
        await pilot.pause()
        out["open_largest_rollout_s"] = time.perf_counter() - t
        out["open_largest_rollout_cpu_s"] = time.process_time() - c
        out["largest_sample_tokens"] = float(len(view.sample.token_ids))

        meter.phase = "tokens tab"
        app.screen.query_one("#rollout-tabs").active = "tab-tokens"
        view.focus()
        await pilot.pause(0.5)
        meter.phase = "token cursor"
        t, c = time.perf_counter(), time.process_time()
        for _ in range(25):
            await pilot.press("n", "pagedown")
        await pilot.pause()
        out["token_moves_50_s"] = time.perf_counter() - t
        out["token_moves_50_cpu_s"] = time.process_time() - c
        meter.stop()
    out["max_stall_ms"] = meter.worst * 1000
    out["max_stall_during"] = meter.worst_phase  # type: ignore[assignment]
    out["max_stall_ms_by_phase"] = {k: round(v * 1000, 1) for k, v in meter.by_phase.items()}  # type: ignore[assignment]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--largest-calls", type=int, default=200)
    parser.add_argument("--largest-system", type=int, default=20_000)
    args = parser.parse_args()
    home = OUT / "home"
    os.environ["FORGETUI_HOME"] = str(home)
    # the project's own modules compiled first, as an installed one is: where PYTHONDONTWRITEBYTECODE is set
    # (this machine) every import compiles its source, and a worker thread importing holds the GIL meanwhile
    for package in ("core", "forgetui"):
        compileall.compile_dir(str(REPO / package), quiet=1)
    built = build(home, args)
    if built:
        print(f"store written in {built:.1f} s", file=sys.stderr)
    idle_before = asyncio.run(baseline())
    result = asyncio.run(drive(home, args.rollouts))
    idle_after = asyncio.run(baseline())
    result["idle_app_max_stall_ms"] = round(max(idle_before, idle_after) * 1000, 1)
    result["load_average_1min"] = os.getloadavg()[0]
    result.update(rollouts=args.rollouts + 1, calls=args.rollouts * args.calls + args.largest_calls)
    print(json.dumps(result, indent=1))
    ok = result["max_stall_ms"] <= FLOOR_STALL_S * 1000
    print(f"largest stall {result['max_stall_ms']:.0f} ms (during {result['max_stall_during']}); "
          f"floor {FLOOR_STALL_S * 1000:.0f} ms: {'met' if ok else 'NOT met'}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
