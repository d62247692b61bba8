#!/usr/bin/env bash
# Runs the peer benchmarks in interleaved rounds and writes RESULTS.md.
#
# Each round runs every benchmark once, each in its own process with a fixed
# iteration count (-benchtime Nx), in forward order on odd rounds and in
# reverse order on even ones. summarize then takes, for every figure, the
# median over the rounds, the spread, and the median of the per-round ratios
# to the baseline measured in the same round.
#
# Environment: ROUNDS (default 11); SCALE multiplies every iteration count
# (default 1; e.g. SCALE=0.1 for a quick look); ONLY, an extended regular
# expression, runs only the benchmarks whose path matches it (e.g.
# ONLY='^Hedging/') and prints their summary instead of writing RESULTS.md.
# Needs only Go: modules come through the module proxy.
set -euo pipefail
cd "$(dirname "$0")"

rounds="${ROUNDS:-11}"
scale="${SCALE:-1}"
start=$SECONDS

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
rm -rf raw
mkdir raw

echo "building the benchmark binary, echo-server and summarize" >&2
go build -o "$work/echo-server" ./cmd/echo-server
go build -o "$work/summarize" ./cmd/summarize
go test -c -o "$work/bench.test" .
export BENCH_ECHO_SERVER="$work/echo-server"

# benchmark (sub-benchmark path) and iterations per round, each sized to run
# for roughly 0.3-1 s on a 2-core machine.
benches=(
	"Admission/baseline/sequential 3000000"
	"Admission/outbound/sequential 6000000"
	"Admission/outbound-timed/sequential 3000000"
	"Admission/outbound-adaptive/sequential 3000000"
	"Admission/gobreaker/sequential 1500000"
	"Admission/failsafe/sequential 400000"
	"Admission/baseline/parallel 3000000"
	"Admission/outbound/parallel 6000000"
	"Admission/outbound-timed/parallel 3000000"
	"Admission/outbound-adaptive/parallel 3000000"
	"Admission/gobreaker/parallel 1500000"
	"Admission/failsafe/parallel 400000"
	"FastFail/outbound 20000000"
	"FastFail/gobreaker 5000000"
	"FastFail/failsafe 800000"
	"EndToEnd/bare/sequential 10000"
	"EndToEnd/outbound/sequential 10000"
	"EndToEnd/failsafehttp/sequential 10000"
	"EndToEnd/retryablehttp/sequential 10000"
	"EndToEnd/gobreaker/sequential 10000"
	"EndToEnd/bare/16-callers 50000"
	"EndToEnd/outbound/16-callers 50000"
	"EndToEnd/failsafehttp/16-callers 50000"
	"EndToEnd/retryablehttp/16-callers 50000"
	"EndToEnd/gobreaker/16-callers 50000"
	"EndToEnd/bare/16-callers-default-idle 30000"
	"EndToEnd/outbound/16-callers-default-idle 30000"
	"EndToEndPaired/16-callers 50000"
	"EndToEndPaired/16-callers-default-idle 30000"
	"EndToEndPaired/16-callers-bare-vs-bare 50000"
	"EndToEndPaired/16-callers-endpoints 50000"
	"EndToEndPaired/16-callers-by-name 50000"
	"IdleBreaker/outbound 1"
	"IdleBreaker/gobreaker 1"
	"IdleBreaker/failsafe 1"
	"Hedging/http1/outbound 10000"
	"Hedging/http1/outbound-hedged 10000"
	"Hedging/http1/outbound-hedged-7 10000"
	"Hedging/http1/failsafe-hedged 10000"
	"Hedging/h2c/outbound 10000"
	"Hedging/h2c/outbound-hedged 10000"
	"Hedging/h2c/outbound-hedged-7 10000"
	"Hedging/h2c/failsafe-hedged 10000"
	"HedgingSaturated/http1/outbound 2000"
	"HedgingSaturated/http1/outbound-hedged 2000"
	"HedgingSaturated/http1/failsafe-hedged 2000"
	"HedgingSaturated/h2c/outbound 2000"
	"HedgingSaturated/h2c/outbound-hedged 2000"
	"HedgingSaturated/h2c/failsafe-hedged 2000"
)
# The fleet-wide rate limit against go-redis/redis_rate, each on a
# redis-server the benchmark starts (Debian package redis-server).
if command -v redis-server >/dev/null 2>&1; then
	benches+=(
		"Fleet/redis_rate/sequential 20000"
		"Fleet/outbound/sequential 20000"
		"Fleet/outbound-leased/sequential 1000000"
		"Fleet/redis_rate/16-goroutines 40000"
		"Fleet/outbound/16-goroutines 40000"
		"Fleet/outbound-leased/16-goroutines 1000000"
	)
else
	echo "redis-server is not installed: the Fleet benchmarks are left out" >&2
fi

if [[ -n "${ONLY:-}" ]]; then
	kept=()
	for b in "${benches[@]}"; do
		if grep -Eq -- "$ONLY" <<<"${b% *}"; then kept+=("$b"); fi
	done
	if ((${#kept[@]} == 0)); then
		echo "run.sh: ONLY=$ONLY matches no benchmark" >&2
		exit 2
	fi
	benches=("${kept[@]}")
fi

run_one() { # name iterations
	local pattern n out
	pattern="^Benchmark${1//\//\$/^}\$"
	n=$(awk -v n="$2" -v s="$scale" 'BEGIN { n = int(n * s); print (n < 1 ? 1 : n) }')
	if ! out=$("$work/bench.test" -test.run '^$' -test.bench "$pattern" \
		-test.benchtime "${n}x" -test.benchmem 2>&1); then
		printf '%s\n' "$out" >&2
		echo "run.sh: $1 failed" >&2
		exit 1
	fi
	if ! grep '^Benchmark' <<<"$out"; then
		printf '%s\n' "$out" >&2
		echo "run.sh: $1 printed no result" >&2
		exit 1
	fi
}

# The library's revision, and how many of its files (outside bench/) differ
# from it. Read-only: GIT_OPTIONAL_LOCKS=0 keeps git from touching the index.
library="not a git checkout"
if rev=$(cd .. && GIT_OPTIONAL_LOCKS=0 git rev-parse --short HEAD 2>/dev/null); then
	changed=$(cd .. && GIT_OPTIONAL_LOCKS=0 git status --porcelain -- . ':(exclude)bench' 2>/dev/null | wc -l)
	library="commit $rev, $changed changed or new paths outside bench/"
fi

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 1; r <= rounds; r++)); do
	if ((r % 2 == 1)); then
		order=("${benches[@]}")
	else
		order=()
		for ((i = ${#benches[@]} - 1; i >= 0; i--)); do order+=("${benches[i]}"); done
	fi
	echo "round $r of $rounds ($((SECONDS - start)) s so far)" >&2
	for b in "${order[@]}"; do
		# shellcheck disable=SC2086 # "name iterations"
		run_one $b
	done >"raw/round-$r.txt"
done
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

if [[ -n "${ONLY:-}" ]]; then
	echo "library measured: $library; $rounds rounds, $((SECONDS - start)) s" >&2
	"$work/summarize" raw/round-*.txt
	exit 0
fi

{
	echo "# Peer benchmark results"
	echo
	echo "Written by \`bench/run.sh\` (settings in [README.md](README.md)); raw output in \`bench/raw/\` (not committed)."
	echo
	echo "| machine | |"
	echo "|---|---|"
	echo "| date (UTC) | $(date -u '+%Y-%m-%d %H:%M') |"
	echo "| cores (nproc) | $(nproc) |"
	echo "| CPU | $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') |"
	echo "| Go | $(go version | cut -d' ' -f3-) |"
	echo "| kernel | $(uname -sr) |"
	echo "| library measured | $library (at build time) |"
	echo "| load average (1, 5, 15 min) before / after | $load_before / $load_after |"
	echo "| rounds | $rounds, iteration counts × $scale, $((SECONDS - start)) s in all |"
	echo
	"$work/summarize" raw/round-*.txt
} >RESULTS.md.tmp
mv RESULTS.md.tmp RESULTS.md

# table_test TEST FLAG FIRST TITLE: runs TEST (enabled by -FLAG) and
# appends to RESULTS.md, under TITLE, its log from the line holding FIRST.
table_test() {
	local out
	echo "$4 ($1)" >&2
	if ! out=$("$work/bench.test" -test.run "^$1\$" "-$2" -test.v -test.timeout 20m 2>&1); then
		printf '%s\n' "$out" >&2
		echo "$1 failed" >&2
		exit 1
	fi
	{
		echo
		echo "## $4 ($1)"
		echo
		echo '```'
		printf '%s\n' "$out" | sed -n "/$3/,/^--- /p" | grep -v '^--- ' | sed 's/^        //'
		echo '```'
	} >>RESULTS.md
}
# Five replica processes behind one name (about 5 minutes).
table_test TestReplicas replicas PROTO "A host is many endpoints"
# Callers whose deadlines are shorter than the upstream's slow path (30 s).
table_test TestDeadlines deadlines CLIENT "Deadlines"
echo "wrote RESULTS.md in $((SECONDS - start)) s" >&2
