module github.com/outboundhq/outbound/redis

go 1.26.0

require (
	github.com/outboundhq/outbound v0.1.0
	github.com/redis/rueidis v1.0.79
)

require (
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

replace github.com/outboundhq/outbound => ../
