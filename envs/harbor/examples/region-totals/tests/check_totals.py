"""Print the fraction of regions whose total is right (0 when the answer is missing or not a JSON object)."""

import csv
import json
import sys
from collections import defaultdict

expected = defaultdict(float)
with open(sys.argv[1], newline="") as f:
    for row in csv.DictReader(f):
        expected[row["region"]] += float(row["amount"])
try:
    with open(sys.argv[2]) as f:
        got = json.load(f)
except (OSError, ValueError) as exc:
    print(f"no readable answer: {exc}", file=sys.stderr)
    got = {}
if not isinstance(got, dict):
    got = {}
right = 0
for region, total in expected.items():
    value = got.get(region)
    if isinstance(value, int | float) and abs(value - total) < 1e-6:
        right += 1
    else:
        print(f"{region}: got {value!r}, expected {total:g}", file=sys.stderr)
print(f"{right / len(expected):g}")
