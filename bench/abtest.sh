#!/usr/bin/env bash
# Compares two benchmarks, or one benchmark in two builds, in interleaved
# rounds, and prints the median and the range of the per-round ratios B/A of
# each figure that both report.
#
#   bench/abtest.sh NAME_A NAME_B ITERATIONS [BIN_A [BIN_B]]
#
# NAME_A and NAME_B are sub-benchmark paths (EndToEnd/bare/16-callers);
# BIN_A and BIN_B are benchmark binaries (go test -c), by default one built
# from this checkout. Rounds alternate the order (A then B, B then A).
# Environment: ROUNDS (default 15). For example, outbound against bare
# net/http, and outbound at two commits:
#
#   bench/abtest.sh EndToEnd/bare/16-callers EndToEnd/outbound/16-callers 30000
#   bench/abtest.sh EndToEnd/outbound/16-callers EndToEnd/outbound/16-callers 30000 old.test new.test
set -euo pipefail
cd "$(dirname "$0")"
if (($# < 3)); then
	sed -n '2,15p' "$0" >&2
	exit 2
fi
rounds="${ROUNDS:-15}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
bin_a="${4:-}" bin_b="${5:-${4:-}}"
if [[ -z "$bin_a" ]]; then
	go test -c -o "$work/bench.test" .
	bin_a="$work/bench.test" bin_b="$work/bench.test"
fi
bin_a="$(realpath "$bin_a")" bin_b="$(realpath "$bin_b")"
if [[ -z "${BENCH_ECHO_SERVER:-}" ]]; then
	go build -o "$work/echo-server" ./cmd/echo-server
	export BENCH_ECHO_SERVER="$work/echo-server"
fi

one() { # label binary name
	local pattern out
	pattern="^Benchmark${3//\//\$/^}\$"
	out=$("$2" -test.run '^$' -test.bench "$pattern" -test.benchtime "${iterations}x" -test.benchmem 2>&1) ||
		{ printf '%s\n' "$out" >&2; exit 1; }
	grep '^Benchmark' <<<"$out" | sed "s/^/$r $1 /" || { printf '%s\n' "$out" >&2; exit 1; }
}
iterations=$3
for ((r = 1; r <= rounds; r++)); do
	if ((r % 2 == 1)); then
		one A "$bin_a" "$1"
		one B "$bin_b" "$2"
	else
		one B "$bin_b" "$2"
		one A "$bin_a" "$1"
	fi
done >"$work/rounds.txt"

awk -v a="$1" -v b="$2" -v rounds="$rounds" '
{ # round label name iterations (value unit)...
	for (i = 5; i < NF; i += 2) v[$1, $2, $(i + 1)] = $i
	for (i = 5; i < NF; i += 2) units[$(i + 1)] = 1
}
END {
	printf "B/A per round, median [range] over %d rounds\nA: %s\nB: %s\n", rounds, a, b
	for (u in units) {
		n = 0
		for (r = 1; r <= rounds; r++)
			if (((r, "A", u) in v) && ((r, "B", u) in v) && v[r, "A", u] != 0)
				x[++n] = v[r, "B", u] / v[r, "A", u]
		if (n == 0) continue
		for (i = 2; i <= n; i++) { t = x[i]; for (j = i - 1; j > 0 && x[j] > t; j--) x[j + 1] = x[j]; x[j + 1] = t }
		med = (n % 2) ? x[(n + 1) / 2] : (x[n / 2] + x[n / 2 + 1]) / 2
		printf "  %-10s %.3f [%.3f-%.3f]\n", u, med, x[1], x[n]
	}
}' "$work/rounds.txt"
