#!/usr/bin/env bash
# Compares the datapath benchmarks (bench/datapath) of a revision with the
# working tree's: both are built, then run in turn, round after round, so that
# the two share the machine's mood (these VMs are noisy: a table measured an
# hour apart is no comparison). Prints, per case, min and median ns/pkt of
# each build and the ratio of the medians.
#
#   hack/bench-compare.sh REV [ROUNDS] [BENCH_REGEX]
#
# Needs root (BPF_PROG_TEST_RUN), like make bench.
set -euo pipefail

rev=${1:?usage: hack/bench-compare.sh REV [ROUNDS] [BENCH_REGEX]}
rounds=${2:-5}
filter=${3:-.}
top=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir "$tmp/before"
git -C "$top" archive "$rev" | tar -x -C "$tmp/before"
(cd "$tmp/before" && go test -c -o "$tmp/before.test" ./bench/datapath/)
(cd "$top" && go test -c -o "$tmp/after.test" ./bench/datapath/)

for round in $(seq "$rounds"); do
	for build in before after; do
		echo "round $round: $build" >&2
		"$tmp/$build.test" -test.run '^$' -test.bench "$filter" -test.benchtime=1x |
			awk -v build="$build" '/ns\/pkt/ { sub(/-[0-9]+$/, "", $1); print build "\t" $1 "\t" $(NF-1) }' >>"$tmp/results"
	done
done

printf '%s\n' "| case | $rev min | $rev median | working tree min | working tree median | median ratio |" "|---|---|---|---|---|---|"
cut -f2 "$tmp/results" | awk '!seen[$0]++' | while read -r name; do
	stats() {
		awk -F'\t' -v b="$1" -v n="$name" '$1 == b && $2 == n { print $3 }' "$tmp/results" | sort -g |
			awk '{ v[NR] = $1 } END { if (NR == 0) { print "- -"; exit } m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; print v[1], m }'
	}
	read -r bmin bmed < <(stats before)
	read -r amin amed < <(stats after)
	ratio=$(awk -v a="$amed" -v b="$bmed" 'BEGIN { if (b + 0 > 0 && a + 0 > 0) printf "%.2f", a / b; else print "-" }')
	label=${name#BenchmarkPodEgress/}
	printf '| %s | %s | %s | %s | %s | %s |\n' "${label//_/ }" "$bmin" "$bmed" "$amin" "$amed" "$ratio"
done
