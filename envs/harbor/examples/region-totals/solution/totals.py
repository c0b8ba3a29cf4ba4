"""Sum the amounts of a region,item,amount CSV per region and print them as JSON."""

import csv
import json
import sys
from collections import defaultdict

totals = defaultdict(float)
with open(sys.argv[1], newline="") as f:
    for row in csv.DictReader(f):
        totals[row["region"]] += float(row["amount"])
print(json.dumps(dict(totals), indent=2))
