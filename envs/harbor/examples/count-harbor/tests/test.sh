#!/bin/bash
# Reward 1 when /app/count.txt holds the number of lines of /app/log.txt with the word "harbor".
mkdir -p /logs/verifier
expected=$(grep -cw 'harbor' /app/log.txt)
got=$(tr -d '[:space:]' < /app/count.txt 2>/dev/null)
if [ "$got" = "$expected" ]; then
  echo "count.txt = $got: correct"
  echo 1 > /logs/verifier/reward.txt
else
  echo "count.txt = '${got}', expected $expected"
  echo 0 > /logs/verifier/reward.txt
fi
