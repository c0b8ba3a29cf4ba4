#!/usr/bin/env bash
# Start a Docker engine on this machine if none answers (idempotent; run as root).
# Installs docker.io and debootstrap from Debian when missing, starts dockerd in the
# background (log: /var/log/dockerd.log, pid: /run/forgetui-dockerd.pid) and waits for it.
set -euo pipefail

LOG=${FORGETUI_DOCKERD_LOG:-/var/log/dockerd.log}
PIDFILE=${FORGETUI_DOCKERD_PIDFILE:-/run/forgetui-dockerd.pid}
WAIT_S=${FORGETUI_DOCKERD_WAIT_S:-60}

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)

if docker info >/dev/null 2>&1; then
    echo "docker-up: engine already answers"
    if [ ${#need[@]} -gt 0 ] && [ "${need[*]}" = "debootstrap" ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap
    fi
    exit 0
fi

if [ ${#need[@]} -gt 0 ]; then
    echo "docker-up: installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi

echo "docker-up: starting dockerd (log: $LOG)"
nohup dockerd >"$LOG" 2>&1 &
echo $! >"$PIDFILE"

for _ in $(seq 1 "$WAIT_S"); do
    if docker info >/dev/null 2>&1; then
        echo "docker-up: engine ready (pid $(cat "$PIDFILE"))"
        exit 0
    fi
    if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        break
    fi
    sleep 1
done

echo "docker-up: dockerd did not come up within ${WAIT_S}s; last lines of $LOG:" >&2
tail -n 40 "$LOG" >&2 || true
exit 1
