#!/usr/bin/env bash
# Fails when a tracked file names how the project was made instead of what it does: the words in
# WORDS below, matched whole and in any case, anywhere in the tree but data/. Lists each match as
# file:line:text. Outside a git checkout (a source tarball) there is nothing to list: it says
# "skipped" and passes. Run from anywhere: scripts/check-words.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# Built from pieces so that this file does not match itself.
WORDS=("ses""sion" "ses""sions")

if ! command -v git >/dev/null 2>&1 || ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "check-words: skipped: $(pwd) is not a git checkout (or git is missing); nothing to check"
  exit 0
fi

args=()
for w in "${WORDS[@]}"; do args+=(-e "$w"); done
rc=0
matches=$(git grep -n -i -w "${args[@]}" -- . ':!data' ':!scripts/check-words.sh') || rc=$?
if [ "$rc" -gt 1 ]; then
  echo "check-words: git grep failed (exit $rc) in $(pwd); run it by hand to see why" >&2
  exit "$rc"
fi
if [ "$rc" -eq 0 ]; then
  echo "check-words: these lines use a word the project keeps out of its files (${WORDS[*]}):"
  echo "$matches"
  echo "check-words: reword each line to say what the software does or what was measured" \
       "(a result file, a date, a topic), then run scripts/check-words.sh again"
  exit 1
fi
echo "check-words: no match for: ${WORDS[*]}"
