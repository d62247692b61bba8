package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outboundtest/testkit"
	"github.com/outboundhq/outbound/outcome"
)

var (
	replicasRun   = flag.Bool("replicas", false, "run TestReplicas: five replica processes behind one name (about 2 minutes)")
	replicasProto = flag.String("replicas.protos", "HTTP1,h2c", "the protocols TestReplicas runs over")
	replicasFault = flag.String("replicas.faults", "stall,503,reset,none", "the faults TestReplicas runs")
)

const (
	replicaCount    = 5
	replicaWorkers  = 16
	replicaDeadline = time.Second
	replicaName     = "replicas.test"
)

// TestReplicaWorker is one replica of TestReplicas, in a process of its
// own: an outboundtest server on OUTBOUND_REPLICA_ADDR (or one on each of
// its comma-separated addresses) that takes commands,
// one per line, on its standard input — ok, stall (2 s before a 200), 503,
// reset (the connection reset once the request is read), clear (forget
// what it received), and stats (what it received, and the executions per
// call id, as JSON on one line) — and answers each with a line.
func TestReplicaWorker(t *testing.T) {
	addr := os.Getenv("OUTBOUND_REPLICA_ADDR")
	if addr == "" {
		t.Skip("a replica process of TestReplicas")
	}
	proto := outboundtest.HTTP1
	if os.Getenv("OUTBOUND_REPLICA_PROTO") == "h2c" {
		proto = outboundtest.H2C
	}
	if os.Getenv("OUTBOUND_REPLICA_PLAIN") != "" {
		plainReplica(strings.Split(addr, ","), proto)
		return
	}
	var ss []*outboundtest.Server
	for _, a := range strings.Split(addr, ",") {
		s, err := outboundtest.NewServerAt(proto, a)
		if err != nil {
			fmt.Println("error", err)
			return
		}
		defer s.Close()
		ss = append(ss, s)
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "stats" {
			ex := map[string]int{}
			received := 0
			for _, s := range ss {
				for _, r := range s.Log() {
					if r.Executed && r.ID != "" {
						ex[r.ID]++
					}
				}
				received += s.TotalReceived()
			}
			b, _ := json.Marshal(map[string]any{"executed": ex, "received": received})
			fmt.Println(string(b))
			continue
		}
		for _, s := range ss {
			switch in.Text() {
			case "ok":
				s.SetDefault(outboundtest.Respond(200))
			case "stall":
				s.SetDefault(outboundtest.Slow(2*time.Second, 200))
			case "503":
				s.SetDefault(outboundtest.Respond(503))
			case "reset":
				s.SetDefault(outboundtest.ResetAfterRead())
			case "clear":
				s.Reset()
			}
		}
		fmt.Println("done")
	}
}

// plainReplica serves addrs with one http.Server answering 200 to every
// request, without a log: the same server behind every address. It answers
// every command with done.
func plainReplica(addrs []string, proto outboundtest.Proto) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	})}
	if proto == outboundtest.H2C {
		p := new(http.Protocols)
		p.SetHTTP1(true)
		p.SetUnencryptedHTTP2(true)
		srv.Protocols = p
	}
	for _, a := range addrs {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			fmt.Println("error", err)
			return
		}
		go srv.Serve(ln)
	}
	defer srv.Close()
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fmt.Println("done")
	}
}

// replica is a replica process, driven through its standard input.
type replica struct {
	addr string
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
}

func (r *replica) say(tb testing.TB, cmd string) string {
	tb.Helper()
	fmt.Fprintln(r.in, cmd)
	if !r.out.Scan() {
		tb.Fatalf("replica %s: no answer to %q", r.addr, cmd)
	}
	return r.out.Text()
}

// startProc starts this test binary running only test, with env added to
// its environment, and reports whether it said "ready" first.
func startProc(tb testing.TB, test, name string, env ...string) (*replica, bool) {
	tb.Helper()
	r := &replica{addr: name}
	r.cmd = exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	r.cmd.Env = append(os.Environ(), env...)
	r.cmd.Stderr = os.Stderr
	r.in, _ = r.cmd.StdinPipe()
	out, _ := r.cmd.StdoutPipe()
	r.out = bufio.NewScanner(out)
	r.out.Buffer(nil, 64<<20)
	if err := r.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	return r, r.out.Scan() && r.out.Text() == "ready"
}

// stopProcs stops processes started by startProc.
func stopProcs(procs []*replica) {
	for _, r := range procs {
		r.in.Close()
		r.cmd.Process.Kill()
		r.cmd.Wait()
	}
}

// startReplicas starts replicaCount replica processes speaking proto on one
// port of 127.0.0.2, 127.0.0.3, … (one process serving every address, with
// oneProcess);
// stop, also called when the test ends, stops them.
func startReplicas(tb testing.TB, proto string, oneProcess bool) (rs []*replica, port string, stop func()) {
	tb.Helper()
	for range 10 {
		ln, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			tb.Skipf("cannot listen on 127.0.0.2 (%v): this machine's loopback has one address", err)
		}
		port = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		ln.Close()
		rs = nil
		ok := true
		var groups []string
		for _, ip := range testkit.Loopbacks(replicaCount) {
			groups = append(groups, net.JoinHostPort(ip.String(), port))
		}
		if oneProcess {
			groups = []string{strings.Join(groups, ",")}
		}
		for _, g := range groups {
			env := []string{"OUTBOUND_REPLICA_ADDR=" + g, "OUTBOUND_REPLICA_PROTO=" + proto}
			if oneProcess {
				env = append(env, "OUTBOUND_REPLICA_PLAIN=1")
			}
			r, ready := startProc(tb, "TestReplicaWorker", g, env...)
			rs = append(rs, r)
			if !ready {
				ok = false
				break
			}
		}
		procs := rs
		var once sync.Once
		stop = func() {
			once.Do(func() { stopProcs(procs) })
		}
		if ok {
			tb.Cleanup(stop)
			return rs, port, stop
		}
		stop() // the port was taken on one of the addresses
	}
	tb.Fatal("no port free on every replica address in 10 tries")
	return nil, "", nil
}

// replicaClient is one side of TestReplicas.
type replicaClient struct {
	name string
	rt   http.RoundTripper
	tr   *outbound.Transport // outbound's, for its breaker
}

// byName dials a name as net/http's dialer does: each address the resolver
// gives, in its order, until one connects.
func byName(names testkit.Names) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, _ := net.SplitHostPort(addr)
		ips, err := names.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return d.DialContext(ctx, network, addr)
		}
		for _, ip := range ips {
			c, e := d.DialContext(ctx, network, net.JoinHostPort(ip.String(), port))
			if e == nil {
				return c, nil
			}
			err = e
		}
		return nil, err
	}
}

// roundRobin sends each request to the next address, keeping the host's
// name in the Host header: a client that rotates over the replicas.
type roundRobin struct {
	next  atomic.Uint64
	addrs []string
	rt    http.RoundTripper
}

func (r *roundRobin) RoundTrip(req *http.Request) (*http.Response, error) {
	u := *req.URL
	u.Host = r.addrs[r.next.Add(1)%uint64(len(r.addrs))]
	out := req.Clone(req.Context())
	out.URL, out.Host = &u, req.URL.Host
	return r.rt.RoundTrip(out)
}

// fivePools sends each request to the next of its transports, all dialing
// the same address: a client with five pools, not five addresses.
type fivePools struct {
	next atomic.Uint64
	rts  [replicaCount]*http.Transport
}

func (f *fivePools) RoundTrip(req *http.Request) (*http.Response, error) {
	return f.rts[f.next.Add(1)%replicaCount].RoundTrip(req)
}

func replicaTransport(proto string) *http.Transport {
	t := &http.Transport{MaxIdleConnsPerHost: replicaWorkers, DialContext: byName(testkit.Names{replicaName: testkit.Loopbacks(replicaCount)})}
	if proto == "h2c" {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		t.Protocols = p
	}
	return t
}

func replicaClients(tb testing.TB, proto, port string) []replicaClient {
	names := testkit.Names{replicaName: testkit.Loopbacks(replicaCount)}
	var addrs []string
	for _, ip := range names[replicaName] {
		addrs = append(addrs, net.JoinHostPort(ip.String(), port))
	}
	bare := replicaTransport(proto)
	rrInner := replicaTransport(proto)
	tb.Cleanup(bare.CloseIdleConnections)
	tb.Cleanup(rrInner.CloseIdleConnections)
	tr, err := outbound.New(outbound.Config{HTTPTransport: replicaTransport(proto),
		Endpoints: &attempt.Endpoints{Resolver: names,
			// Short ejections, so that a healed replica is back within the run.
			Ejection: attempt.Ejection{BaseTime: 2 * time.Second, MaxTime: 4 * time.Second, MaxShare: 0.2}}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(tr.Close)
	one, err := outbound.New(outbound.Config{HTTPTransport: replicaTransport(proto)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(one.Close)
	five := new(fivePools)
	for i := range five.rts {
		five.rts[i] = replicaTransport(proto)
		tb.Cleanup(five.rts[i].CloseIdleConnections)
	}
	return []replicaClient{
		{name: "net/http", rt: bare},
		{name: "round-robin", rt: &roundRobin{addrs: addrs, rt: rrInner}},
		{name: "outbound-1", rt: one, tr: one},
		{name: "outbound", rt: tr, tr: tr},
		{name: "five-pools", rt: five}, // for the paired rounds only
	}
}

// replicaRun is what one client's run of a scenario came to.
type replicaRun struct {
	calls, failedGET, failedPOST int
	cpu                          time.Duration   // the client process's CPU time
	lat                          []time.Duration // of the successful calls
	whyGET                       map[string]int  // why GETs failed
	breakerOpened                bool
}

// drive runs replicaWorkers callers through rt for d, with one call in five
// a POST without an Idempotency-Key carrying a unique id, the rest GETs,
// each call within replicaDeadline, while phases runs; it returns when
// both are done.
func drive(rt http.RoundTripper, tr *outbound.Transport, port, client string, workers int, d time.Duration, phases func()) replicaRun {
	var mu sync.Mutex
	var run replicaRun
	var seq atomic.Int64
	stop := time.Now().Add(d)
	cpu0 := cpuTime()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				post := i%5 == 0
				ctx, cancel := context.WithTimeout(context.Background(), replicaDeadline)
				method := http.MethodGet
				var body io.Reader
				if post {
					method, body = http.MethodPost, strings.NewReader(`{"qty":1}`)
				}
				req, _ := http.NewRequestWithContext(ctx, method, "http://"+replicaName+":"+port+"/", body)
				req.Header.Set(outboundtest.IDHeader, fmt.Sprintf("%s-%s-%d-%d", method, client, w, seq.Add(1)))
				start := time.Now()
				var resp *http.Response
				var err error
				var out *outcome.Outcome
				if tr != nil {
					resp, out, err = tr.Do(req)
				} else {
					resp, err = rt.RoundTrip(req)
				}
				ok := err == nil && resp.StatusCode < 500
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					ok = ok && err == nil
				}
				took := time.Since(start)
				cancel()
				mu.Lock()
				run.calls++
				switch {
				case ok:
					run.lat = append(run.lat, took)
				case post:
					run.failedPOST++
				default:
					run.failedGET++
					why := "no error"
					switch {
					case out != nil:
						why = out.Why()
						for _, a := range out.Attempts {
							why += fmt.Sprintf(" | %v %d %s", a.Category, a.Status, a.Endpoint)
						}
					case err != nil:
						why = err.Error()
					case resp != nil:
						why = resp.Status
					}
					if run.whyGET == nil {
						run.whyGET = map[string]int{}
					}
					run.whyGET[why]++
				}
				if tr != nil {
					if m, ok := tr.Breakers()["http://"+replicaName+":"+port]; ok && m.State != circuit.Closed {
						run.breakerOpened = true
					}
				}
				mu.Unlock()
			}
		})
	}
	phases()
	wg.Wait()
	run.cpu = time.Duration(cpuTime() - cpu0)
	return run
}

func pct(l []time.Duration, q float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// duplicates asks every replica what it executed and returns the POSTs
// executed more than once (GETs may be, by a retry).
func duplicates(tb testing.TB, rs []*replica) int {
	total := map[string]int{}
	for _, r := range rs {
		var st struct{ Executed map[string]int }
		if err := json.Unmarshal([]byte(r.say(tb, "stats")), &st); err != nil {
			tb.Fatal(err)
		}
		for id, n := range st.Executed {
			total[id] += n
		}
	}
	dup := 0
	for id, n := range total {
		if n > 1 && strings.HasPrefix(id, http.MethodPost) {
			dup++
		}
	}
	return dup
}

// TestReplicas runs five replica processes behind one name on 127.0.0.2–6
// and compares, in the same run, bare net/http (which dials the first
// address that accepts and keeps its connections there), a client that
// rotates requests over the addresses, and outbound with Endpoints, under
// three scenarios: the first replica stalls 2 s for four seconds of eight;
// the first answers 503, or resets connections, for four seconds, then
// heals; and all are healthy. 16 callers, a 1 s deadline per call, one
// call in five an unkeyed POST. Then, all healthy and paired, the cost of
// spreading: two clients at once, each in a process of its own
// (pairedProcs), against one process serving the five addresses.
func TestReplicas(t *testing.T) {
	if !*replicasRun {
		t.Skip("run with -replicas (bench/run.sh does)")
	}
	var out strings.Builder
	fmt.Fprintf(&out, "%-6s %-7s %-12s %7s %8s %8s %9s %8s %8s %8s %8s %4s %s\n", "PROTO", "FAULT", "CLIENT", "CALLS", "SUCCESS", "FAIL-GET", "FAIL-POST",
		"DUP-POST", "P50", "P99", "CPU/CALL", "BRK", "FIRST-REPLICA")
	for _, proto := range strings.Split(*replicasProto, ",") {
		rs, port, stop := startReplicas(t, proto, false)
		for _, fault := range strings.Split(*replicasFault, ",") {
			if fault == "" {
				continue // -replicas.faults= : the paired rounds only
			}
			for _, c := range replicaClients(t, proto, port) {
				if c.name == "five-pools" {
					continue
				}
				for _, r := range rs {
					r.say(t, "ok")
				}
				for _, r := range rs {
					r.say(t, "clear")
				}
				var during int
				run := drive(c.rt, c.tr, port, c.name, replicaWorkers, 8*time.Second, func() {
					time.Sleep(2 * time.Second)
					if fault != "none" {
						rs[0].say(t, fault)
					}
					during = receivedBy(t, rs[0])
					time.Sleep(4 * time.Second)
					during = receivedBy(t, rs[0]) - during
					rs[0].say(t, "ok")
				})
				after := receivedBy(t, rs[0])
				dup := duplicates(t, rs)
				succ := float64(len(run.lat)) / float64(run.calls) * 100
				fmt.Fprintf(&out, "%-6s %-7s %-12s %7d %7.3f%% %8d %9d %8d %8s %8s %8s %4v during the fault %d, in all %d\n", proto, fault, c.name, run.calls, succ,
					run.failedGET, run.failedPOST, dup, pct(run.lat, 0.5).Round(10*time.Microsecond), pct(run.lat, 0.99).Round(10*time.Microsecond),
					(run.cpu / time.Duration(run.calls)).Round(100*time.Nanosecond),
					map[bool]string{true: "open", false: "-"}[run.breakerOpened], during, after)
				if c.tr != nil { // outbound's reasons (net/http's name each connection)
					for why, n := range run.whyGET {
						fmt.Fprintf(&out, "       a GET failed %d× : %s\n", n, why)
					}
				}
				for _, r := range rs {
					r.say(t, "ok")
				}
			}
		}
		stop()
	}
	fmt.Fprintf(&out, "\nAll healthy, paired: two client processes at once, %d callers each, one process serving the five addresses,\n"+
		"%d rounds of %v; the second's calls/s and CPU per call over the first's, median [range]; the first pair is a client against itself:\n",
		replicaWorkers/2, pairRounds, pairRound)
	for _, proto := range strings.Split(*replicasProto, ",") {
		rs, port, stop := startReplicas(t, proto, true)
		for _, pair := range [][2]string{{"outbound-1", "outbound-1"}, {"outbound-1", "outbound"}, {"net/http", "round-robin"}, {"net/http", "five-pools"}} {
			rps, cpu := pairedProcs(t, rs[0], proto, port, pair)
			fmt.Fprintf(&out, "%-6s %-11s / %-10s calls/s %.3f× [%.3f–%.3f], CPU per call %.3f× [%.3f–%.3f]\n", proto, pair[1], pair[0],
				rps[len(rps)/2], rps[0], rps[len(rps)-1], cpu[len(cpu)/2], cpu[0], cpu[len(cpu)-1])
		}
		stop()
	}
	t.Log("\n" + out.String())
}

const (
	pairRounds = 10
	pairRound  = 2 * time.Second
)

// pairedProcs runs the clients named by pair at once, each in a process of its
// own (TestReplicaClient) with half the callers, for pairRounds rounds of
// pairRound after one round of warm-up, and returns the second's calls and
// CPU per call over the first's in each round, sorted. Both share every
// moment of the machine: what a noisy neighbour takes, it takes from both.
func pairedProcs(tb testing.TB, server *replica, proto, port string, pair [2]string) (rps, cpu []float64) {
	tb.Helper()
	var cs []*replica
	defer func() { stopProcs(cs) }()
	for i, name := range pair {
		c, ready := startProc(tb, "TestReplicaClient", name, "OUTBOUND_REPLICA_CLIENT="+name,
			"OUTBOUND_REPLICA_PROTO="+proto, "OUTBOUND_REPLICA_PORT="+port, "OUTBOUND_REPLICA_TAG="+strconv.Itoa(i))
		cs = append(cs, c)
		if !ready {
			tb.Fatalf("client %s did not start", name)
		}
	}
	for round := range pairRounds + 1 {
		server.say(tb, "clear")
		for _, c := range cs {
			fmt.Fprintln(c.in, pairRound)
		}
		var calls [2]float64
		var used [2]float64
		for i, c := range cs {
			if !c.out.Scan() {
				tb.Fatalf("client %s: no answer", c.addr)
			}
			if _, err := fmt.Sscan(c.out.Text(), &calls[i], &used[i]); err != nil || calls[i] == 0 {
				tb.Fatalf("client %s: %q (%v)", c.addr, c.out.Text(), err)
			}
		}
		if round > 0 {
			rps = append(rps, calls[1]/calls[0])
			cpu = append(cpu, used[1]/calls[1]/(used[0]/calls[0]))
		}
	}
	slices.Sort(rps)
	slices.Sort(cpu)
	return rps, cpu
}

// TestReplicaClient is one client of TestReplicas' paired rounds, in a
// process of its own: the client named OUTBOUND_REPLICA_CLIENT over
// OUTBOUND_REPLICA_PROTO to the replicas' OUTBOUND_REPLICA_PORT. It says
// ready, then for each duration read from its standard input drives half
// of replicaWorkers callers for that long and answers with its calls and
// the CPU time it used, in nanoseconds.
func TestReplicaClient(t *testing.T) {
	name := os.Getenv("OUTBOUND_REPLICA_CLIENT")
	if name == "" {
		t.Skip("a client process of TestReplicas")
	}
	port := os.Getenv("OUTBOUND_REPLICA_PORT")
	var c *replicaClient
	for _, x := range replicaClients(t, os.Getenv("OUTBOUND_REPLICA_PROTO"), port) {
		if x.name == name {
			c = &x
		}
	}
	if c == nil {
		fmt.Println("no client", name)
		return
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		d, err := time.ParseDuration(in.Text())
		if err != nil {
			fmt.Println(err)
			return
		}
		run := drive(c.rt, nil, port, name+os.Getenv("OUTBOUND_REPLICA_TAG"), replicaWorkers/2, d, func() { time.Sleep(d) })
		fmt.Println(run.calls, int64(run.cpu))
	}
}

func receivedBy(tb testing.TB, r *replica) int {
	var st struct{ Received int }
	if err := json.Unmarshal([]byte(r.say(tb, "stats")), &st); err != nil {
		tb.Fatal(err)
	}
	return st.Received
}
