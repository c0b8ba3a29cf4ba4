"""The `forgetui` command line: the TUI by default, and headless subcommands."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.errors import ForgetuiError
from core.models.precision import DTYPES
from core.train.trainers import TRAINERS
from forgetui.analyze import register as register_analytics
from forgetui.argtypes import PORT, SECONDS, float_range, int_range

log = logging.getLogger("forgetui")


def _setup_logging(verbose: bool) -> None:
    from rich.logging import RichHandler

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=_stderr_console(), show_path=False, rich_tracebacks=False)],
    )


def _stderr_console():  # noqa: ANN202 - rich import kept lazy
    from rich.console import Console

    return Console(stderr=True)


def _quiet_libraries() -> None:
    """stderr is forgetui's progress display: no third-party progress bars (read when those libraries import)."""
    from core.models.quiet import QUIET_ENV

    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    for name in ("httpx", "httpcore", "LiteLLM", "litellm", "urllib3", "docker"):
        logging.getLogger(name).setLevel(logging.WARNING)


def cmd_proxy(args: argparse.Namespace) -> int:
    from core.config import PolicyConfig, validated
    from core.proxy.standalone import run_standalone_proxy

    policy = validated(PolicyConfig, {"backend": args.backend, "tokenizer": args.tokenizer, "parser": args.parser}, "--")

    def ready(url: str, store: Path) -> None:
        log.info("forgetui proxy listening on %s (store %s)", url, store)
        print(url, flush=True)

    asyncio.run(
        run_standalone_proxy(
            policy.spec,
            host=args.host,
            port=args.port,
            store_path=Path(args.store) if args.store else None,
            on_ready=ready,
            tokenizer=policy.tokenizer,
            parser=policy.parser,
            max_body_bytes=args.max_body_bytes,
            call_timeout_s=args.call_timeout,
        )
    )
    return 0


def cmd_serve_model(args: argparse.Namespace) -> int:
    from core.proxy.model_server import serve_model

    def ready(url: str) -> None:
        print(url, flush=True)

    if args.engine == "vllm":
        return _serve_vllm(args, ready)
    asyncio.run(serve_model(args.model, args.host, args.port, dtype=args.dtype, on_ready=ready))
    return 0


def _serve_vllm(args: argparse.Namespace, ready: Callable[[str], None]) -> int:
    """`serve-model --engine vllm`: vLLM's OpenAI server for MODEL until Ctrl-C/SIGTERM (or until it exits)."""
    import signal
    import time
    from dataclasses import replace

    from core.backends.vllm_server import ServerSettings, VllmServer

    options = dict(opt.split("=", 1) for opt in args.vllm_option)
    if args.dtype != "auto":
        options["dtype"] = args.dtype
    settings = replace(ServerSettings.from_options(args.model, options), host=args.host, port=args.port)
    server = VllmServer(settings)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops the server as Ctrl-C does
    try:
        server.start()
        print(f"vLLM log: {server.log_path}", file=sys.stderr, flush=True)
        ready(server.base_url)
        while server.alive:
            time.sleep(1.0)
        server.check()  # it exited on its own: say why
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    from core.paths import home
    from core.store.query import format_result, latest_store, run_query, run_shards, store_for_run
    from core.store.shard_query import run_query_shards

    if args.store:
        store = Path(args.store)
    elif args.run:
        store = store_for_run(args.run)
        shards = run_shards(args.run)
        if shards:  # a veRL run: one store per agent-loop worker, read as one
            result = run_query_shards([store, *shards] if store.exists() else shards, args.query)
            text = format_result(result, args.format)
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
            return 0
    else:
        found = latest_store(home())
        if found is None:
            raise ForgetuiError(f"no store found under {home()}: run `forgetui proxy` or `forgetui run` first, or pass --store PATH")
        store = found
    if not store.exists():
        raise ForgetuiError(f"no store at {store}")
    result = run_query(store, args.query)
    text = format_result(result, args.format)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    _warn_store_problems(store, run_query)
    from core.store.query import newer_schema

    if (warning := newer_schema(store)) is not None:
        log.warning("%s", warning)
    return 0


def _warn_store_problems(store: Path, run_query: Callable[..., Any]) -> None:
    """Say on stderr when the store kept rows it could not store as given (`store_errors`, `dead_letters`)."""
    try:
        rows = run_query(store, "SELECT kept_in, rows FROM store_problems WHERE rows > 0").rows
    except ForgetuiError:  # a store from before these tables
        return
    for kept_in, n in rows:
        log.warning("this store holds %d row(s) in %s that could not be stored as given: SELECT * FROM %s", n, kept_in, kept_in)


def cmd_run(args: argparse.Namespace) -> int:
    from core.config import load_config
    from core.session.setup import load_run_config
    from forgetui.headless import run_headless

    if args.resume:
        config = load_run_config(args.resume)
    elif args.config:
        config = load_config(args.config, args.set)
    else:
        raise ForgetuiError("give a CONFIG.toml (see examples/) or --resume RUN_ID")
    if args.command == "eval":
        config.train.steps = 0
    ks = None
    if args.k:
        try:
            ks = sorted({int(k) for k in args.k.split(",") if k.strip()})
        except ValueError:
            raise ForgetuiError(f"-k expects comma-separated integers, got {args.k!r}") from None
        if not ks or ks[0] < 1:
            raise ForgetuiError("-k values must be ≥ 1")
    if args.no_ui or not sys.stdout.isatty():  # pipes and redirects get the headless run
        return run_headless(config, resume=args.resume, json_out=args.no_ui, ks=ks)
    from forgetui.tui.app import run_tui

    return run_tui(run_config=config, resume=args.resume, ks=ks)


def cmd_export(args: argparse.Namespace) -> int:
    import json

    from core.train.export import export_run

    result = export_run(args.run, args.format, args.out, args.min_reward)
    log.info("wrote %d %s rows of run %s to %s", result.rows, result.format, result.run_id, result.path)
    print(json.dumps(result.as_dict()), flush=True)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from core.config import load_config

    config = load_config(args.config, args.set)
    if config.train.steps <= 0:
        raise ForgetuiError("forgetui train needs train.steps > 0 (in the config or --set train.steps=N)")
    trainer = args.trainer or config.train.trainer
    if trainer != "verl":  # the same as `forgetui run` on a training config
        args.set = [*args.set, f"train.trainer={trainer}"]
        args.command, args.resume, args.k = "run", None, None
        return cmd_run(args)
    from core.run import execute_run

    config.train.trainer = "verl"
    options = {
        "nnodes": args.nnodes, "n_gpus_per_node": args.n_gpus_per_node, "model": args.model, "max_prompt_length": args.max_prompt_length,
        "max_response_length": args.max_response_length, "tensor_parallel": args.tp, "agent_workers": args.agent_workers,
        "extra": args.override, "dry_run": args.dry_run, "on_plan": lambda plan: print(plan.command_line(), flush=True),
    }  # fmt: skip
    summary = asyncio.run(execute_run(config, trainer_options=options))
    return int(summary.extra.get("exit_code") or 0)


def cmd_gc(args: argparse.Namespace) -> int:
    from core.rollout.orphans import reap_dead_runs
    from core.runtime import make_runtime

    total = 0
    for kind in args.runtime:
        if kind == "kubernetes" and args.config:  # the cluster, context and namespace the runs used
            from core.config import load_config

            runtime = make_runtime(kind, config=load_config(args.config, args.set).runtime.kubernetes)
        else:
            runtime = make_runtime(kind)
        if not runtime.available():
            log.info("runtime %s is not available; skipped", kind)
            continue
        removed = asyncio.run(reap_dead_runs(runtime, everything=args.all))
        log.info("%s: removed %d orphaned sandbox(es)", kind, removed)
        total += removed
        if kind == "docker":  # older fills of a harness's shared volume (its files changed since)
            from core.runtime.harness_volume import prune_harness_volumes

            stale = prune_harness_volumes(runtime.client, everything=args.all)
            log.info("docker: removed %d unused harness volume(s)%s", len(stale), f": {', '.join(stale)}" if stale else "")
    if args.checkpoints:
        from core.paths import runs_dir
        from core.train.prune import prune_runs

        log.info("runs: %.1f GB freed (older trainer states, finished runs' pushed weights)", prune_runs(runs_dir()) / 1e9)
    print(total)
    return 0


def cmd_images(args: argparse.Namespace) -> int:
    from core.runtime import images

    if args.images_command == "bootstrap":
        print(images.bootstrap_base(args.tag, args.suite, mirror=args.mirror))
    elif args.images_command == "list":
        for row in images.list_images():
            print(row["id"], " ".join(row["tags"]), row["size"])
    elif args.images_command == "build":
        from core.config import load_config
        from core.errors import ConfigError
        from core.registry import load_env, load_harness
        from core.session.setup import build_image, env_kwargs, pick_runtime

        config = load_config(args.config, args.set)
        env = load_env(config.env.name, **env_kwargs(config))  # env.path and env.strict too, as a run loads it
        harness = load_harness(config.harness.name, **config.harness.adapter_options())
        if args.push and not config.runtime.registry:
            raise ConfigError("--push needs runtime.registry: the registry your cluster pulls from (e.g. --set runtime.registry=ghcr.io/me)")
        runtime = pick_runtime(config)
        if runtime.images == "cluster":  # pods run what this engine builds, once pushed (or `kind load`ed)
            from core.runtime import make_runtime
            from core.session.setup import RunImages, select_tasks

            # the task image(s) (each task's own Dockerfile too), then the shared harness's image: one per line
            tasks = select_tasks(env, config.env.tasks, config.env.limit)
            tags = RunImages(make_runtime("docker"), config, env, harness).k8s_build_blocking(tasks, args.platform)
        else:
            if args.platform:
                raise ConfigError("--platform is for Kubernetes images (runtime.kind = \"kubernetes\"): Docker sandboxes run on this engine's own")
            tags = [build_image(runtime, config, env, harness)]
        for tag in tags:
            print(images.push_image(tag, config.runtime.registry) if args.push and config.runtime.registry else tag)
    elif args.images_command == "push":
        print(images.push_image(args.tag, args.registry))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from forgetui.demo import run_demo

    run_demo(train=not args.no_train, verbose=args.verbose)
    return 0


def _add_proxy(sub: Any) -> None:
    p = sub.add_parser("proxy", help="run the recording proxy on its own (harnesses run by hand)")
    p.add_argument("--backend", required=True, help="builtin:MODEL | scripted:FILE | vllm:URL | litellm:MODEL")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=PORT, default=8400)
    p.add_argument("--store", help="DuckDB file (default: FORGETUI_HOME/stores/proxy-<time>.duckdb)")
    p.add_argument("--tokenizer", help="the policy's model for tokenization (needed by vllm:URL)")
    p.add_argument("--parser", default="hermes", help="tool-call parser for token backends (hermes, qwen)")
    p.add_argument("--max-body-bytes", type=int_range(1024, 1 << 40, "bytes"), default=32 * 1024 * 1024)
    p.add_argument("--call-timeout", type=SECONDS, default=None, help="seconds a model call may take before it fails (default: no limit; a backend spec's ?timeout= bounds silence from its upstream)")
    p.set_defaults(func=cmd_proxy)


def _add_serve_model(sub: Any) -> None:
    p = sub.add_parser("serve-model", help="serve a local model over a vLLM-compatible token-in/token-out API")
    p.add_argument("model", help="tiny | smollm2-135m | a local HF folder | a hub id")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=PORT, default=8500)
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="what the model computes in (auto: bfloat16 on a CUDA GPU, float32 on a CPU)")
    p.add_argument("--engine", default="builtin", choices=("builtin", "vllm"), help="builtin: forgetui's own vLLM-shaped server; vllm: the real vLLM (`make vllm` installs it)")
    p.add_argument("--vllm-option", action="append", default=[], metavar="KEY=VALUE", type=_key_value, help="--engine vllm: a server option as a vllm:MODEL spec takes it (max_model_len, lora, max_lora_rank, kv_cache, args, log, ready_timeout, model)")
    p.set_defaults(func=cmd_serve_model)


def _key_value(text: str) -> str:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return text


def _add_sql(sub: Any) -> None:
    p = sub.add_parser("sql", help="query a store with DuckDB SQL (works while it is being written)")
    p.add_argument("query")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--store", help="path of a .duckdb store")
    where.add_argument("--run", help="a run id (FORGETUI_HOME/runs/RUN_ID/store.duckdb, or its veRL workers' shards read as one)")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.set_defaults(func=cmd_sql)


def _add_run_and_eval(sub: Any) -> None:
    for name, text in (("run", "run a config: rollouts in sandboxes, scored, recorded (training with train.steps > 0)"), ("eval", "run a config without training and report pass@k / pass^k")):
        p = sub.add_parser(name, help=text)
        p.add_argument("config", nargs="?", help="a run config (TOML); see examples/")
        p.add_argument("--no-ui", action="store_true", help="headless: progress on stderr, one JSON summary on stdout")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key, e.g. run.n_samples=4")
        p.add_argument("--resume", metavar="RUN_ID", help="finish what an interrupted run left unfinished")
        p.add_argument("-k", metavar="K,K,...", help="the k of pass@k and pass^k (default 1..n_samples)")
        p.set_defaults(func=cmd_run)


def _add_export(sub: Any) -> None:
    p = sub.add_parser("export", help="write a run's recorded data for other trainers: samples (jsonl), chat conversations (sft), veRL parquet (verl)")
    p.add_argument("run", help="a run id (FORGETUI_HOME/runs/RUN_ID) or the path of a store.duckdb")
    p.add_argument("--format", choices=["sft", "verl", "jsonl"], required=True, help="sft: OpenAI-chat conversations of passing rollouts; verl: one RL-dataset row per task; jsonl: one training sample per line")
    p.add_argument("--out", help="output file (default: the run folder's export/samples.jsonl, sft.jsonl or verl.parquet)")
    p.add_argument("--min-reward", type=float_range(-1e12, 1e12, "a reward"), default=None, help="keep rollouts with at least this reward (sft default 1.0; jsonl default all)")
    p.set_defaults(func=cmd_export)


def _add_train(sub: Any) -> None:
    p = sub.add_parser("train", help="train on a config: --trainer local (this machine) or verl (writes veRL's dataset and overrides, launches its PPO trainer on GPUs)")
    p.add_argument("config", help="a run config (TOML) with train.steps > 0")
    p.add_argument("--trainer", choices=TRAINERS.names(), default=None, help="default: train.trainer of the config")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--no-ui", action="store_true", help="local: headless, one JSON summary on stdout")
    p.add_argument("--dry-run", action="store_true", help="verl: write the dataset, agent-loop YAML and overrides, print the command, launch nothing")
    p.add_argument("--nnodes", type=int_range(1, 1 << 20, "nodes"), default=1, help="verl: trainer.nnodes")
    p.add_argument("--n-gpus-per-node", type=int_range(1, 1024, "GPUs"), default=8, help="verl: trainer.n_gpus_per_node")
    p.add_argument("--model", help="verl: the policy's HF folder or hub id (default: from policy.backend)")
    p.add_argument("--max-prompt-length", type=int_range(1, 1 << 31, "tokens"), default=4096, help="verl: tokens of a sample's first prompt")
    p.add_argument("--max-response-length", type=int_range(1, 1 << 31, "tokens"), default=8192, help="verl: tokens after it (completions and tool results)")
    p.add_argument("--tp", type=int_range(1, 1024, "GPUs"), default=1, help="verl: vLLM tensor parallel size")
    p.add_argument("--agent-workers", type=int_range(1, 1 << 16, "workers"), default=None, help="verl: agent-loop workers (each its own proxy and store shard)")
    p.add_argument("--override", action="append", default=[], metavar="HYDRA_OVERRIDE", help="verl: an extra Hydra override, appended last")
    p.set_defaults(func=cmd_train)


def _add_gc(sub: Any) -> None:
    p = sub.add_parser("gc", help="remove sandboxes left behind by runs that died (kill -9), and unused older harness volumes")
    p.add_argument("--checkpoints", action="store_true", help="also free runs' disk: every checkpoint's trainer state (optimizer, schedule) but the newest train.keep_states of its run, and the weights finished runs pushed to their vLLM server; the checkpoints' weights stay")
    p.add_argument("--runtime", action="append", choices=["docker", "local", "kubernetes"], default=None)
    p.add_argument("--all", action="store_true", help="also remove every forgetui sandbox of this owner, live runs included (kubernetes: made by this installation, the id kept in FORGETUI_HOME), and every unused harness volume")
    p.add_argument("--config", help="kubernetes: the run config whose [runtime.kubernetes] names the cluster and namespace")
    p.add_argument("--set", action="append", default=[])
    p.set_defaults(func=cmd_gc)


def _add_images(sub: Any) -> None:
    p = sub.add_parser("images", help="build, list and push sandbox images")
    isub = p.add_subparsers(dest="images_command", required=True)
    b = isub.add_parser("bootstrap", help="build the base image with debootstrap and docker import (no registry needed)")
    b.add_argument("--tag", default="forgetui/base:bookworm")
    b.add_argument("--suite", default="bookworm")
    b.add_argument("--mirror", default="http://deb.debian.org/debian")
    isub.add_parser("list", help="list forgetui images")
    b = isub.add_parser("build", help="build the env+harness image of a config (on the local engine; for kubernetes the task image and the shared harness's image, one per line)")
    b.add_argument("config")
    b.add_argument("--set", action="append", default=[])
    b.add_argument("--push", action="store_true", help="then push them to runtime.registry and print the names pods pull")
    b.add_argument("--platform", help="kubernetes: the nodes' platform (linux/amd64, linux/arm64); every image is built and checked for it")
    b = isub.add_parser("push", help="push an image to a registry (for Kubernetes)")
    b.add_argument("tag")
    b.add_argument("registry")
    p.set_defaults(func=cmd_images)


def _add_demo(sub: Any) -> None:
    p = sub.add_parser("demo", help="what `make demo` runs: short evals on built-in defaults, the recorded rows, then a short training that moves the reward")
    p.add_argument("--no-train", action="store_true", help="skip the training part (base → SFT → GRPO on hello with the tiny model)")
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="show log records (INFO and up); the demo shows only warnings otherwise")
    p.set_defaults(func=cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forgetui", description="Train AI agents inside the harnesses they ship in.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    sub = parser.add_subparsers(dest="command")
    _add_proxy(sub)
    _add_serve_model(sub)
    _add_sql(sub)
    _add_run_and_eval(sub)
    _add_export(sub)
    _add_train(sub)
    _add_gc(sub)
    _add_images(sub)
    register_analytics(sub)  # analyze, compare, replay
    _add_demo(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    _quiet_libraries()
    if args.command is None:
        from forgetui.tui.app import run_tui

        return run_tui()
    if args.command == "gc" and args.runtime is None:
        args.runtime = ["docker", "local"]
    try:
        return args.func(args)
    except ForgetuiError as exc:
        log.error("%s", exc)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
