#!/usr/bin/env bash
# Size limits of the sources (issue 44): no non-test source file over 900 lines, no function over
# 150 lines. Files: *.cpp *.hpp *.cu *.cuh *.h under alloc kernels optimizer tier trainer bench
# examples python, tests excluded (tests/ and *_test.* / test_*.*). Function lengths need lizard
# (pip install lizard); without it only file sizes are checked. Installs nothing.
# Usage: scripts/check-sizes.sh [max_file_lines [max_function_lines]]; exits 1 if any is over.
set -euo pipefail
cd "$(dirname "$0")/.."
max_file=${1:-900}
max_fn=${2:-150}
dirs=()
for d in alloc kernels optimizer tier trainer bench examples python; do [[ -d $d ]] && dirs+=("$d"); done

files=()
while IFS= read -r -d '' f; do
  case "$f" in
    */tests/* | */test/* | *_test.* | */test_*.*) continue ;;
  esac
  files+=("$f")
done < <(find "${dirs[@]}" -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' -o -name '*.h' \) \
           -not -path '*/build*' -print0 | sort -z)

status=0
echo "files over $max_file lines:"
over=0
for f in "${files[@]}"; do
  n=$(wc -l < "$f")
  if (( n > max_file )); then
    printf '  %6d  %s\n' "$n" "$f"
    over=$((over + 1))
  fi
done
(( over == 0 )) && echo "  none"
(( over > 0 )) && status=1

lizard_cmd=()
if command -v lizard > /dev/null 2>&1; then
  lizard_cmd=(lizard)
elif python3 -c 'import lizard' > /dev/null 2>&1; then
  lizard_cmd=(python3 -m lizard)
fi
if (( ${#lizard_cmd[@]} == 0 )); then
  echo "function lengths: skipped (pip install lizard)"
  exit $status
fi

echo "functions over $max_fn lines:"
# lizard's CSV: NLOC,CCN,token,PARAM,length,location,file,function,long_name,start,end. The
# length checked is the function's span in lines (end - start + 1), comments and blanks included.
long=$("${lizard_cmd[@]}" --csv "${files[@]}" 2> /dev/null |
  awk -F, -v max="$max_fn" '
    { n = NF; start = $(n - 1); end = $n; len = end - start + 1
      if (len > max) { file = $7; gsub(/"/, "", file); loc = $6; gsub(/"/, "", loc); sub(/@.*/, "", loc)
                       printf "  %6d  %s:%d  %s\n", len, file, start, loc } }' | sort -k2)
if [[ -n $long ]]; then
  echo "$long"
  status=1
else
  echo "  none"
fi
exit $status
