#!/bin/bash
# Reward = the fraction of regions whose total in /app/totals.json is right (partial credit).
mkdir -p /logs/verifier
python3 "$(dirname "$0")/check_totals.py" /app/data/sales.csv /app/totals.json > /logs/verifier/reward.txt
echo "reward: $(cat /logs/verifier/reward.txt)"
