#!/usr/bin/env bash
# Prints what `make test` must not hide: every transfer a test tried again
# (a stall, or a goodput measurement on a shared machine, for a reason the
# test names), and every failure's evidence kept (captures, sockets,
# counters), from the directory make test gave the tests.
#
# usage: hack/test-summary.sh <test output dir>
set -euo pipefail
dir=${1:?test output directory}

echo "--- test summary"
retries="$dir/retries.tsv"
if [[ -s "$retries" ]]; then
	echo "transfers tried again, each for a reason its test names: $(wc -l <"$retries")"
	cut -f1,2 "$retries" | sort | uniq -c | sed 's/^/  /'
else
	echo "transfers tried again: 0"
fi
mapfile -t kept < <(find "$dir" -maxdepth 3 -type d -name 'evidence-*' 2>/dev/null | sort)
if ((${#kept[@]} > 0)); then
	echo "failures with evidence kept: ${#kept[@]}"
	for d in "${kept[@]}"; do
		echo "  $d: $(head -c 300 "$d/failure.txt" 2>/dev/null | tr '\n' ' ')"
	done
else
	echo "failures with evidence kept: 0"
fi
