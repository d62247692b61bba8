package attempt

import (
	"fmt"
	"net/http"
	"testing"
)

// Forgetting an upstream drops the routes that lead to it, by their keys,
// and no other: an upstream forgotten when its last connection closes
// (lastConnGone) used to look at every route of the Attempter to find its
// own, so that many upstreams called once each and forgotten one at a time
// cost time quadratic in their number. Two spellings of one host are two
// routes to one upstream; both go with it.
func TestForgettingAnUpstreamDropsItsOwnRoutesAndNoOther(t *testing.T) {
	a, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	const n = 64
	route := func(host string) *Route {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+host+"/", nil)
		r, err := a.Route(req)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for i := range n {
		route(fmt.Sprintf("h%d.test", i))
	}
	r0 := route("h0.test:80") // another spelling of h0.test: another route, the same upstream
	a.mu.RLock()
	routes := len(a.routes)
	a.mu.RUnlock()
	if routes != n+1 || len(r0.up.routes) != 2 {
		t.Fatalf("%d routes, %d to h0.test; want %d and 2", routes, len(r0.up.routes), n+1)
	}
	for i := range n {
		u := route(fmt.Sprintf("h%d.test", i)).up
		p := u.pools[0]
		a.lastConnGone(p)
		if !u.forgotten.Load() {
			t.Fatalf("h%d.test not forgotten when its last connection went", i)
		}
		a.mu.RLock()
		left := len(a.routes)
		for hk, r := range a.routes {
			if r.up.forgotten.Load() {
				t.Errorf("a route %v to a forgotten upstream is kept", hk)
			}
		}
		a.mu.RUnlock()
		if want := n - 1 - i; left != want {
			t.Fatalf("after forgetting %d upstreams: %d routes, want %d", i+1, left, want)
		}
	}
}

// BenchmarkForgettingUpstreamsOneAtATime forgets N upstreams, each as its
// last connection goes, and reports the time per upstream: flat in N since
// each drops its own routes (before, each looked at every route: about
// 200 µs per upstream at N = 10,000, 2,600 µs at 40,000).
func BenchmarkForgettingUpstreamsOneAtATime(b *testing.B) {
	for _, n := range []int{10_000, 40_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				a, err := New(Config{MaxUpstreams: 1 << 20})
				if err != nil {
					b.Fatal(err)
				}
				ups := make([]*upstream, 0, n)
				for i := range n {
					req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://h%d.test/", i), nil)
					r, err := a.Route(req)
					if err != nil {
						b.Fatal(err)
					}
					ups = append(ups, r.up)
				}
				b.StartTimer()
				for _, u := range ups {
					a.lastConnGone(u.pools[0])
				}
				b.StopTimer()
				a.Close()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/upstream")
		})
	}
}
