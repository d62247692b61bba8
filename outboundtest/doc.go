// Package outboundtest provides an HTTP upstream that fails on demand, for
// testing HTTP clients as net/http/httptest does for handlers.
//
// A [Server] listens on a random port of 127.0.0.1 and speaks HTTP/1.1
// ([HTTP1]), HTTP/2 with prior knowledge ([H2C]) or HTTP/2 over TLS ([H2TLS]).
// Each request is given a [Fault]: an answer, a delay, or a failure injected at
// the TCP, HTTP/1.1 or HTTP/2 frame level. The server counts, per call id
// carried in the [IDHeader] request header, how many requests arrived and how
// many it processed, so a test can assert what a client library must
// guarantee, such as "a POST is executed at most once", and compare it with
// what the client reported.
//
//	s := outboundtest.NewServer(outboundtest.H2C)
//	defer s.Close()
//	s.Enqueue(outboundtest.ResetAfterRead(), outboundtest.Respond(503, "Retry-After", "1"))
//	// ... send requests with the Outbound-Test-Id header through the client under test ...
//	if s.Executions("order-42") > 1 { ... }
//
// Faults are one-shot when queued with [Server.Enqueue] (requests) or
// [Server.EnqueueConn] (accepted connections); otherwise every request gets
// the default set by [Server.SetDefault]. [Server.Pause] and [Server.Resume]
// simulate an outage and the recovery on the same URL.
//
// The HTTP/2 side is a minimal peer written on golang.org/x/net/http2.Framer,
// not a full server: it honours flow control, PING and SETTINGS, serves
// concurrent streams and discards request bodies, but it does not enforce
// every rule of RFC 9113 on what clients send.
package outboundtest
