#!/usr/bin/env bash
# The size rules of ../shared/STYLE.md, checked: prints the largest source files and functions, then fails if a .cc
# or .h file in src/ is over 600 lines (400 in src/learner and src/syncer) or a function over 80 lines, unless
# tools/size_exceptions.txt names it with its reason. Run by ctest (SizeRules) too.
set -euo pipefail
cd "$(dirname "$0")/.."
py=/usr/bin/python3
[ -x "$py" ] || py=python3
echo "[sizes] largest files in src/:"
find src -name '*.cc' -o -name '*.h' | xargs wc -l | grep -v ' total$' | sort -rn | awk 'NR <= 12'
echo "[sizes] longest functions in src/:"
"$py" tools/longest_functions.py -n 12 src
bad=0
while read -r lines file; do
  limit=600
  case "$file" in src/learner/*|src/syncer/*) limit=400 ;; esac
  if [ "$lines" -gt "$limit" ]; then
    if grep -qE "^file $file( |$)" tools/size_exceptions.txt 2>/dev/null; then
      echo "[sizes] $file: $lines lines (limit $limit; an exception: tools/size_exceptions.txt)"
    else
      echo "[sizes] $file: $lines lines, over the limit of $limit"
      bad=1
    fi
  fi
done < <(find src -name '*.cc' -o -name '*.h' | xargs wc -l | grep -v ' total$' | awk '{print $1, $2}')
echo "[sizes] functions over 80 lines:"
"$py" tools/longest_functions.py --over 80 src || bad=1
if [ "$bad" -ne 0 ]; then
  echo "[sizes] FAILED: split the file or function where a step has a name, or list it with its reason in tools/size_exceptions.txt"
  exit 1
fi
echo "[sizes] every file and function within its limit"
