#!/bin/bash
# The desktop oracle: known-good scripted actions for the running task, through the `gui` CLI.
exec python3 "$(dirname "$0")/oracle.py"
