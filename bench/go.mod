module github.com/outboundhq/outbound/bench

go 1.26.0

replace github.com/outboundhq/outbound => ../

require (
	github.com/failsafe-go/failsafe-go v0.9.8
	github.com/hashicorp/go-retryablehttp v0.7.8
	github.com/outboundhq/outbound v0.1.0
	github.com/sony/gobreaker/v2 v2.4.0
	golang.org/x/time v0.16.0
)

require (
	github.com/bits-and-blooms/bitset v1.24.4 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/influxdata/tdigest v0.0.1 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)
