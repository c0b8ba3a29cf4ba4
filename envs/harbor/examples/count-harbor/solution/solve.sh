#!/bin/bash
set -euo pipefail
grep -cw 'harbor' /app/log.txt > /app/count.txt
