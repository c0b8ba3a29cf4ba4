#!/usr/bin/env bash
# The Kubernetes runtime's stand-in tests under the oldest `kubernetes` and `websocket-client` that
# pyproject.toml allows, then under the newest on the index (not in CI: it downloads from the package index;
# 15 minutes for both here, on 2 busy cores). Each pair is installed without its dependencies into a throwaway folder put first
# on PYTHONPATH, in front of .venv's own copies; the tests then run as usual.
#   bash .ci/k8s-client-versions.sh                 # both
#   bash .ci/k8s-client-versions.sh oldest          # one
#   TESTS="tests/test_k8s_failures.py" bash .ci/k8s-client-versions.sh oldest
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
TESTS=${TESTS:-tests/test_runtime_kubernetes.py tests/test_k8s_failures.py tests/test_k8s_isolation.py tests/test_k8s_shared_harness.py}
which=("${@:-oldest newest}")

# "name==version" of the lowest (or highest) release the pyproject's ">=" bound allows
pick() {
    "$PY" - "$1" "$2" <<'EOF'
import json, re, subprocess, sys, tomllib
from packaging.specifiers import SpecifierSet
from packaging.version import Version
name, end = sys.argv[1], sys.argv[2]
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
spec = next(SpecifierSet(d[len(name):]) for d in deps if re.match(rf"{re.escape(name)}\s*[<>=!~]", d))
out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name], capture_output=True, text=True, check=True).stdout
versions = sorted(v for v in map(Version, re.search(r"Available versions: (.*)", out)[1].split(", ")) if not v.is_prerelease and v in spec)
print(f"{name}=={versions[0] if end == 'oldest' else versions[-1]}")
EOF
}

rc=0
for end in ${which[*]}; do
    dir=$(mktemp -d /tmp/forgetui-k8s-client.XXXXXX)
    pins=("$(pick kubernetes "$end")" "$(pick websocket-client "$end")")
    echo "== $end: ${pins[*]}"
    "$PY" -m pip install -q --no-deps --target "$dir" "${pins[@]}"
    PYTHONPATH="$dir" "$PY" -c "import kubernetes, websocket; print('using kubernetes', kubernetes.__version__, 'and websocket-client', websocket.__version__, 'from', kubernetes.__file__)"
    # shellcheck disable=SC2086
    PYTHONPATH="$dir" "$PY" -m pytest $TESTS -q -p no:cacheprovider -m "not slow" || rc=$?
    rm -rf "$dir"
done
exit $rc
