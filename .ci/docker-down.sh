#!/usr/bin/env bash
# Stop the dockerd that .ci/docker-up.sh started (found by its pid file); leaves others alone.
set -euo pipefail

PIDFILE=${FORGETUI_DOCKERD_PIDFILE:-/run/forgetui-dockerd.pid}
WAIT_S=${FORGETUI_DOCKERD_WAIT_S:-30}

if [ ! -f "$PIDFILE" ]; then
    echo "docker-down: no pid file at $PIDFILE; nothing started by docker-up.sh"
    exit 0
fi
pid=$(cat "$PIDFILE")
if kill -0 "$pid" 2>/dev/null; then
    echo "docker-down: stopping dockerd (pid $pid)"
    kill -TERM "$pid"
    for _ in $(seq 1 "$WAIT_S"); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "docker-down: dockerd still running after ${WAIT_S}s; sending KILL" >&2
        kill -KILL "$pid" || true
    fi
fi
rm -f "$PIDFILE"
