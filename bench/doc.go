// Package bench compares outbound with its peers — failsafe-go, sony/gobreaker
// with golang.org/x/time/rate, and hashicorp/go-retryablehttp — on admission
// cost, fast failure, end-to-end throughput over loopback and memory per idle
// breaker. Everything is in the benchmarks of this package; run.sh runs them
// in interleaved rounds and writes RESULTS.md. See README.md for the settings.
package bench
