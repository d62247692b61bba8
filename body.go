package outbound

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
)

// The bodies a call wraps: the request's (trackedBody), an answer held
// while its retry is not certain (heldBody), an answer read ahead
// (prefixedBody), and the final answer's, which ends the call's timeouts
// (finalBody).

// trackedBody is a request body that knows whether it was read, and keeps
// the caller's body open for another attempt while that is possible.
type trackedBody struct {
	rc    io.ReadCloser
	read  atomic.Bool
	state atomic.Int32 // bodyOpen, bodyCloseDeferred or bodyCallEnded
	once  sync.Once
}

const (
	bodyOpen          = iota
	bodyCloseDeferred // a transport closed it unread while the call went on
	bodyCallEnded     // the call has ended: a Close closes
)

func (b *trackedBody) Read(p []byte) (int, error) {
	b.read.Store(true)
	return b.rc.Read(p)
}

// Close closes the caller's body, unless it was never read and the call is
// still going on: a transport that gives up before sending it (an HTTP/2
// connection that was shutting down, an HTTP/1 connection lost before a
// byte was written) closes it unread, and the call may still send it on its
// next attempt. The close then happens when the call ends.
func (b *trackedBody) Close() error {
	if !b.read.Load() && b.state.CompareAndSwap(bodyOpen, bodyCloseDeferred) {
		return nil
	}
	return b.closeNow()
}

// callEnded is called when the call returns an answer: a close deferred
// until then happens now, and later ones at once.
func (b *trackedBody) callEnded() {
	if b != nil && b.state.Swap(bodyCallEnded) == bodyCloseDeferred {
		b.closeNow()
	}
}

// closeNow closes the caller's body (once).
func (b *trackedBody) closeNow() error {
	if b == nil {
		return nil
	}
	b.state.Store(bodyCallEnded)
	var err error
	b.once.Do(func() { err = b.rc.Close() })
	return err
}

// touched reports whether b was read (a nil body was not).
func (b *trackedBody) touched() bool { return b != nil && b.read.Load() }

// heldBody is the body of a held answer: what was read of it, then how its
// reading ended.
type heldBody struct {
	r   *bytes.Reader
	err error // nil: the body ended normally
}

func (b *heldBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF && b.err != nil {
		err = b.err
	}
	return n, err
}

func (b *heldBody) Close() error { return nil }

// prefixedBody is a body of which a prefix was read ahead: the prefix, then
// the rest.
type prefixedBody struct {
	io.Reader
	io.Closer
}

// finalBody is the body of the call's final answer: closing it, or reading
// it to the end, ends the attempt's and the call's timeouts.
type finalBody struct {
	io.ReadCloser
	once    sync.Once
	cancels [2]context.CancelFunc
}

func (b *finalBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.release()
	}
	return n, err
}

func (b *finalBody) Close() error {
	err := b.ReadCloser.Close()
	b.release()
	return err
}

func (b *finalBody) release() {
	b.once.Do(func() {
		for _, cancel := range b.cancels {
			if cancel != nil {
				cancel()
			}
		}
	})
}

// holdLimit bounds the body of an answer that is to be retried: it is read
// into memory (which also frees its connection for reuse) and kept until the
// retry is certain, so that a retry that cannot happen after all — the
// context ends during the wait, GetBody fails, the next attempt never
// reaches the upstream — still gives the caller that answer. An answer with
// a longer body is returned instead of retried.
const holdLimit = 16 << 10

// hold keeps resp, an answer about to be retried, until the retry is
// certain: its body is read into memory (up to holdLimit) and closed, which
// resolves its attempt and frees its connection. It reports false, and
// gives resp its whole body back, when the body is longer than holdLimit.
func (c *call) hold(resp *http.Response) bool {
	data, err := io.ReadAll(io.LimitReader(resp.Body, holdLimit+1))
	if len(data) > holdLimit {
		resp.Body = &prefixedBody{Reader: io.MultiReader(bytes.NewReader(data), resp.Body), Closer: resp.Body}
		return false
	}
	resp.Body.Close()
	c.dropHeld()
	resp.Body = &heldBody{r: bytes.NewReader(data), err: err}
	c.held = resp
	return true
}

func (c *call) dropHeld() {
	if c.held != nil {
		c.held.Body.Close()
		c.held = nil
	}
}
