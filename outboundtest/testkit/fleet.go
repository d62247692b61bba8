package testkit

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Names is a resolver (attempt.Resolver) that maps host names to
// addresses, and fails for any other name as DNS does.
type Names map[string][]netip.Addr

// LookupNetIP returns the addresses of host.
func (m Names) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := m[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// Loopbacks returns n addresses: 127.0.0.2, 127.0.0.3, …
func Loopbacks(n int) []netip.Addr {
	a := make([]netip.Addr, n)
	for i := range a {
		a[i] = netip.AddrFrom4([4]byte{127, 0, 0, byte(2 + i)})
	}
	return a
}

// AddrPorts returns "ip:port" of each of ips.
func AddrPorts(ips []netip.Addr, port uint16) []string {
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = netip.AddrPortFrom(ip, port).String()
	}
	return out
}

// Fleet is an in-memory set of HTTP/1.1 replicas, one per "ip:port", for
// tests in a synctest bubble (Dial is a DialContext). Each answers every
// request with its status after its delay — a status of 0 refuses
// connections — and counts the requests it received and the Host headers
// it was asked for.
type Fleet struct {
	mu       sync.Mutex
	status   map[string]int
	cycle    map[string][]int // statuses answered in turn, by address
	delay    map[string]time.Duration
	received map[string]int
	hosts    map[string]bool
	dialed   []string
}

// NewFleet returns a fleet of replicas at addrs ("ip:port"), answering 200.
func NewFleet(addrs ...string) *Fleet {
	f := &Fleet{status: map[string]int{}, cycle: map[string][]int{}, delay: map[string]time.Duration{}, received: map[string]int{}, hosts: map[string]bool{}}
	for _, a := range addrs {
		f.status[a] = 200
	}
	return f
}

// Set makes the replica at addr answer status (0: refuse connections).
func (f *Fleet) Set(addr string, status int) {
	f.mu.Lock()
	f.status[addr] = status
	f.mu.Unlock()
}

// Cycle makes the replica at addr answer statuses in turn, again and again.
func (f *Fleet) Cycle(addr string, statuses ...int) {
	f.mu.Lock()
	f.status[addr] = statuses[0]
	f.cycle[addr] = statuses
	f.mu.Unlock()
}

// SetDelay makes the replica at addr answer after d.
func (f *Fleet) SetDelay(addr string, d time.Duration) {
	f.mu.Lock()
	f.delay[addr] = d
	f.mu.Unlock()
}

// Received returns how many requests the replica at addr received.
func (f *Fleet) Received(addr string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.received[addr]
}

// Reset forgets the requests received.
func (f *Fleet) Reset() {
	f.mu.Lock()
	clear(f.received)
	f.mu.Unlock()
}

// Dialed returns the addresses dialed, in order.
func (f *Fleet) Dialed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.dialed)
}

// Hosts returns the Host headers the replicas were asked for.
func (f *Fleet) Hosts() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var h []string
	for k := range f.hosts {
		h = append(h, k)
	}
	slices.Sort(h)
	return h
}

// Dial connects to the replica at addr, or is refused.
func (f *Fleet) Dial(_ context.Context, _, addr string) (net.Conn, error) {
	f.mu.Lock()
	f.dialed = append(f.dialed, addr)
	st, known := f.status[addr]
	f.mu.Unlock()
	if !known || st == 0 {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	return servePipe(addr, func(addr string, req *http.Request) string {
		f.mu.Lock()
		f.received[addr]++
		f.hosts[req.Host] = true
		st, d := f.status[addr], f.delay[addr]
		if c := f.cycle[addr]; len(c) > 0 {
			st = c[(f.received[addr]-1)%len(c)]
		}
		f.mu.Unlock()
		time.Sleep(d)
		if st == 0 {
			return ""
		}
		return fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Length: 2\r\n\r\nok", st, http.StatusText(st))
	}), nil
}

// PipeDial returns a DialContext of in-memory HTTP/1.1 upstreams, for tests
// in a synctest bubble: each connection reads requests and writes, for
// each, the raw response answer gives for the address dialed (answer may
// sleep: the upstream's work). It closes the connection after an answer
// that says "Connection: close", or an empty one.
func PipeDial(answer func(addr string) string) func(context.Context, string, string) (net.Conn, error) {
	return func(_ context.Context, _, addr string) (net.Conn, error) {
		return servePipe(addr, func(addr string, _ *http.Request) string { return answer(addr) }), nil
	}
}

// servePipe returns the client's end of an in-memory connection whose other
// end answers each request with answer's raw response.
func servePipe(addr string, answer func(addr string, req *http.Request) string) net.Conn {
	return PipeConn(func(w io.Writer, req *http.Request) bool {
		resp := answer(addr, req)
		if resp == "" {
			return false
		}
		_, err := io.WriteString(w, resp)
		return err == nil && !strings.Contains(resp, "\r\nConnection: close\r\n")
	})
}

// PipeConn returns the client's end of an in-memory connection whose other
// end reads requests (their bodies to the end) and gives each to serve,
// which writes the raw response as it likes — in pieces, with pauses — and
// says whether to read the next request on the connection.
func PipeConn(serve func(w io.Writer, req *http.Request) bool) net.Conn {
	client, server := net.Pipe()
	go func() {
		defer server.Close()
		r := bufio.NewReader(server)
		for {
			req, err := http.ReadRequest(r)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			if !serve(server, req) {
				return
			}
		}
	}()
	return client
}
