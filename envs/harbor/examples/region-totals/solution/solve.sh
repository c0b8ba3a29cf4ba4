#!/bin/bash
set -euo pipefail
python3 "$(dirname "$0")/totals.py" /app/data/sales.csv > /app/totals.json
