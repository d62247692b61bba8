package outboundredis

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/circuit"
)

// SignalConfig configures a Signal.
type SignalConfig struct {
	// Client reaches Redis (its pub/sub); required.
	Client rueidis.Client

	// Channel is the pub/sub channel the fleet shares. Zero means
	// "outbound:breaker".
	Channel string

	// Replica names this process in the messages it publishes, so that it
	// ignores its own. Zero means the host name, the process ID and a
	// random suffix.
	Replica string

	// Timeout bounds each publication. Zero means 1 s.
	Timeout time.Duration

	// OnReceive, if set, is told of every opening another replica
	// published, and whether this process had a breaker for it to open.
	OnReceive func(upstream, replica string, wait time.Duration, applied bool)
}

// Breakers is where a Signal finds the breaker of an upstream: an
// *outbound.Transport or an *attempt.Attempter.
type Breakers interface {
	Breaker(upstream string) (*circuit.Breaker, bool)
}

// Signal shares the openings of breakers across a fleet. When a breaker of
// this process opens on its own evidence (its failure or slow-call rate), the
// Signal publishes the upstream and the wait on Redis; when another replica
// publishes one, it opens this process's breaker of that upstream for the
// same wait (circuit.Breaker.OpenFor). Trial calls stay local: each replica
// closes on its own evidence.
//
// Delivery is at most once: an opening published while a replica's
// subscription is down (Redis restarting), or whose publication fails or
// times out, is not seen by it — one that Redis delivers after its
// publication timed out (a frozen Redis coming back) is dropped; the replica
// then opens on its own evidence, as without the Signal.
//
// Nothing touches Redis on the admission path: Observe only hands a
// transition to the Signal's own goroutine, and no lock is held around
// calls. Openings the Signal applied, Retry-After pauses and an operator's
// SetState are not published again, so openings never echo around the fleet.
// An upstream this process has no state for is left alone (its state is
// not created for it).
type Signal struct {
	client   rueidis.Client
	channel  string
	replica  string
	timeout  time.Duration
	onRecv   func(string, string, time.Duration, bool)
	out      chan string
	breakers Breakers

	mu     sync.Mutex
	cancel context.CancelFunc // ends the subscription
	done   chan struct{}
	wg     sync.WaitGroup
	closed bool
}

// NewSignal returns a Signal that publishes what Observe is given. It
// listens to the other replicas once Attach has told it where the breakers
// are.
func NewSignal(cfg SignalConfig) (*Signal, error) {
	if cfg.Client == nil {
		return nil, errors.New("outboundredis: SignalConfig.Client is required")
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("outboundredis: SignalConfig.Timeout must be >= 0, got %v", cfg.Timeout)
	}
	if strings.ContainsAny(cfg.Replica, "\t\n") {
		return nil, errors.New("outboundredis: SignalConfig.Replica cannot hold a tab or a newline")
	}
	s := &Signal{client: cfg.Client, channel: cmp.Or(cfg.Channel, "outbound:breaker"), replica: cfg.Replica,
		timeout: cmp.Or(cfg.Timeout, time.Second), onRecv: cfg.OnReceive, out: make(chan string, 64),
		done: make(chan struct{})}
	if s.replica == "" {
		host, _ := os.Hostname()
		var b [4]byte
		rand.Read(b[:])
		s.replica = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	s.wg.Go(s.publish)
	return s, nil
}

// Replica returns the name this process publishes under.
func (s *Signal) Replica() string { return s.replica }

// Observe takes the admission events of this process's upstreams: give it
// to admission.Config.OnEvent (or outbound.Config.Hooks.Guard). It
// publishes a breaker's opening from CLOSED on its own evidence, without
// waiting: a publication that cannot be queued is dropped. A failed round of
// trial calls (HALF_OPEN to OPEN) is not published: each replica recovers
// on its own trials.
func (s *Signal) Observe(e admission.Event) {
	tr := e.Transition
	if e.Kind != admission.Transition || tr.To != circuit.Open || tr.From != circuit.Closed ||
		(tr.Cause != circuit.CauseFailureRate && tr.Cause != circuit.CauseSlowCallRate) ||
		strings.ContainsAny(e.Upstream, "\t\n") {
		return
	}
	msg := s.replica + "\t" + strconv.FormatInt(tr.Wait.Milliseconds(), 10) + "\t" + e.Upstream
	select {
	case s.out <- msg:
	default:
	}
}

// publish sends the openings Observe queued. Each message carries the
// instant its publication times out (Unix milliseconds, this process's
// clock): a client may still send a command whose context has ended — when a
// frozen Redis comes back, say — and a replica that receives it after that
// instant drops it rather than open a breaker late (see apply).
func (s *Signal) publish() {
	for {
		select {
		case <-s.done:
			return
		case msg := <-s.out:
			deadline := time.Now().Add(s.timeout)
			replica, rest, _ := strings.Cut(msg, "\t")
			msg = replica + "\t" + strconv.FormatInt(deadline.UnixMilli(), 10) + "\t" + rest
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			s.client.Do(ctx, s.client.B().Publish().Channel(s.channel).Message(msg).Build())
			cancel()
		}
	}
}

// Attach subscribes to the other replicas' openings and applies them to
// b's breakers. It returns once the subscription is confirmed (a message of
// its own has come back through it), or an error within the Timeout, after
// which Attach may be called again. The subscription is kept, and made again
// after Redis comes back, until Close.
func (s *Signal) Attach(b Breakers) error {
	ctx, cancel := context.WithCancel(context.Background())
	hello := s.replica + "\thello\t" + strconv.FormatInt(time.Now().UnixNano(), 10)
	heard := make(chan struct{})
	var once sync.Once
	s.mu.Lock()
	if s.closed || s.breakers != nil {
		s.mu.Unlock()
		cancel()
		return errors.New("outboundredis: the Signal is closed or already attached")
	}
	s.breakers, s.cancel = b, cancel
	s.wg.Go(func() {
		sub := s.client.B().Subscribe().Channel(s.channel).Build()
		for ctx.Err() == nil {
			s.client.Receive(ctx, sub, func(m rueidis.PubSubMessage) {
				if m.Message == hello {
					once.Do(func() { close(heard) })
					return
				}
				if ctx.Err() == nil {
					s.apply(m.Message)
				}
			})
			select { // Redis is away: subscribe again, unhurried
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	// The hello goes out from a goroutine of its own too: a client may
	// wait for its own timeouts, not the context's, while it connects.
	s.wg.Go(func() {
		tick := time.NewTicker(max(s.timeout/20, time.Millisecond))
		defer tick.Stop()
		for ctx.Err() == nil {
			pctx, pcancel := context.WithTimeout(ctx, s.timeout)
			s.client.Do(pctx, s.client.B().Publish().Channel(s.channel).Message(hello).Build())
			pcancel()
			select {
			case <-heard:
				return
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	})
	s.mu.Unlock()
	deadline := time.NewTimer(s.timeout)
	defer deadline.Stop()
	select {
	case <-heard:
		return nil
	case <-ctx.Done(): // Close
		return errors.New("outboundredis: the Signal was closed while attaching")
	case <-deadline.C:
		// Not waiting for the goroutines to end: against a Redis that does
		// not answer, the client may take its own timeouts to give up.
		// They end by themselves, and apply nothing meanwhile.
		cancel()
		s.mu.Lock()
		if !s.closed {
			s.breakers, s.cancel = nil, nil
		}
		s.mu.Unlock()
		return fmt.Errorf("outboundredis: the subscription to %q was not confirmed within %v", s.channel, s.timeout)
	}
}

// apply opens the local breaker of an opening another replica published,
// unless it arrived after its publication had timed out: late, it would open
// the breaker for a wait that began long before, on evidence the publisher
// has given up on. (The two clocks are taken to agree within the Timeout, 1 s
// by default; NTP keeps hosts within milliseconds.)
func (s *Signal) apply(payload string) {
	replica, rest, ok1 := strings.Cut(payload, "\t")
	until, rest, ok2 := strings.Cut(rest, "\t")
	ms, upstream, ok3 := strings.Cut(rest, "\t")
	deadline, err1 := strconv.ParseInt(until, 10, 64)
	wait, err2 := strconv.ParseInt(ms, 10, 64)
	if !ok1 || !ok2 || !ok3 || err1 != nil || err2 != nil || wait <= 0 || replica == s.replica ||
		time.Now().UnixMilli() > deadline {
		return
	}
	d := time.Duration(wait) * time.Millisecond
	s.mu.Lock()
	breakers := s.breakers
	s.mu.Unlock()
	if breakers == nil { // an Attach that failed
		return
	}
	applied := false
	if b, ok := breakers.Breaker(upstream); ok {
		applied = b.OpenFor(d)
	}
	if s.onRecv != nil {
		func() {
			defer func() { _ = recover() }()
			s.onRecv(upstream, replica, d, applied)
		}()
	}
}

// Close stops publishing and listening.
func (s *Signal) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	cancel := s.cancel
	s.mu.Unlock()
	close(s.done)
	if cancel != nil {
		cancel()
	}
	s.wg.Wait()
	return nil
}
