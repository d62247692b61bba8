package classify_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"golang.org/x/net/http2"

	"github.com/outboundhq/outbound/classify"
)

func TestFailureClassification(t *testing.T) {
	refused := http2.StreamError{StreamID: 3, Code: http2.ErrCodeRefusedStream}
	internal := http2.StreamError{StreamID: 3, Code: http2.ErrCodeInternal}
	goAway := http2.GoAwayError{LastStreamID: 5}
	above := errors.New("http2: Transport received Server's graceful shutdown GOAWAY")
	aboveFirst := errors.New("http2: Transport received GOAWAY from server ErrCode:ENHANCE_YOUR_CALM")
	for _, tc := range []struct {
		name    string
		facts   classify.Facts
		wantCat classify.Category
		wantEv  classify.Evidence
	}{
		{"local guard", classify.Facts{Stage: classify.StageAdmission, Err: errors.New("full")}, classify.LocalRejection, classify.EvidenceLocalGuard},
		{"dns", classify.Facts{Stage: classify.StageDNS, Err: errors.New("no such host")}, classify.NotSent, classify.EvidenceNoConnection},
		{"refused connection", classify.Facts{Stage: classify.StageDial, Err: syscall.ECONNREFUSED}, classify.NotSent, classify.EvidenceNoConnection},
		{"tls", classify.Facts{Stage: classify.StageTLS, Err: io.EOF}, classify.NotSent, classify.EvidenceNoConnection},
		{"EOF with nothing written", classify.Facts{Stage: classify.StageAwait, Written: 0, Err: io.EOF}, classify.NotSent, classify.EvidenceNothingWritten},
		{"EOF after the request", classify.Facts{Stage: classify.StageAwait, Written: 120, Err: io.EOF}, classify.Ambiguous, classify.EvidenceBytesWritten},
		{"reset while writing the body", classify.Facts{Stage: classify.StageWriteBody, Written: 4096, Err: syscall.ECONNRESET}, classify.Ambiguous, classify.EvidenceBytesWritten},
		{"headers buffered, never flushed", classify.Facts{Stage: classify.StageWriteBody, Written: 0, Err: syscall.EPIPE}, classify.NotSent, classify.EvidenceNothingWritten},
		{"REFUSED_STREAM", classify.Facts{Stage: classify.StageAwait, Written: 80, Err: refused}, classify.NotSent, classify.EvidenceRefusedStream},
		{"REFUSED_STREAM wrapped", classify.Facts{Stage: classify.StageAwait, Written: 80, Err: fmt.Errorf("rt: %w", refused)}, classify.NotSent, classify.EvidenceRefusedStream},
		{"other stream reset", classify.Facts{Stage: classify.StageAwait, Written: 80, Err: internal}, classify.Ambiguous, classify.EvidenceStreamReset},
		{"stream reset before any byte", classify.Facts{Stage: classify.StageWriteHeaders, Written: 0, Err: internal}, classify.NotSent, classify.EvidenceNothingWritten},
		{"GOAWAY at or below", classify.Facts{Stage: classify.StageAwait, Written: 80, Err: goAway}, classify.Ambiguous, classify.EvidenceGoAwayAtOrBelow},
		{"GOAWAY above", classify.Facts{Stage: classify.StageAwait, Written: 80, Err: above}, classify.NotSent, classify.EvidenceGoAwayAbove},
		{"GOAWAY above, first stream, error code", classify.Facts{Stage: classify.StageAwait, Written: 80, Err: aboveFirst}, classify.NotSent, classify.EvidenceGoAwayAboveWithError},
		{"connection shutting down, no stream opened", classify.Facts{Stage: classify.StageAwait, Written: 80, Err: errors.New("http2: client conn not usable"), Reused: true}, classify.NotSent, classify.EvidenceConnShuttingDown},
		{"new connection closed before its first stream", classify.Facts{Stage: classify.StageAwait, Written: 80, Err: errors.New("http2: client conn could not be established")}, classify.NotSent, classify.EvidenceConnNotEstablished},
		{"cancelled with nothing written yet", classify.Facts{Stage: classify.StageWriteHeaders, Written: 0, Err: context.Canceled, Cancelled: true}, classify.Ambiguous, classify.EvidenceCancelledInFlight},
		{"cancelled after REFUSED_STREAM", classify.Facts{Stage: classify.StageAwait, Written: 0, Err: refused, Cancelled: true}, classify.NotSent, classify.EvidenceRefusedStream},
		{"GOAWAY text inside another message", classify.Facts{Stage: classify.StageAwait, Written: 80, Err: errors.New("x: " + above.Error())}, classify.Ambiguous, classify.EvidenceBytesWritten},
		{"REFUSED_STREAM from a connection going away", classify.Facts{Stage: classify.StageAwait, Written: 80, Err: refused, Draining: true}, classify.Ambiguous, classify.EvidenceResetWhileDraining},
		{"other reset from a connection going away", classify.Facts{Stage: classify.StageAwait, Written: 80, Err: internal, Draining: true}, classify.Ambiguous, classify.EvidenceResetWhileDraining},
		{"PROTOCOL_ERROR reset: net/http stops using the connection itself", classify.Facts{Stage: classify.StageAwait, Written: 80,
			Err: http2.StreamError{StreamID: 3, Code: http2.ErrCodeProtocol}, Draining: true}, classify.Ambiguous, classify.EvidenceStreamReset},
		{"REFUSED_STREAM from a distrusted upstream", classify.Facts{Stage: classify.StageAwait, Written: 80, Err: refused, DistrustRefused: true}, classify.Ambiguous, classify.EvidenceRefusedUntrusted},
		{"GOAWAY above, connection going away", classify.Facts{Stage: classify.StageAwait, Written: 80, Err: above, Draining: true}, classify.NotSent, classify.EvidenceGoAwayAbove},
		{"net/http closed the idle connection before the request, TLS wrote close_notify", classify.Facts{Stage: classify.StageAwait, Written: 24,
			Err: errors.New("http: server closed idle connection"), Reused: true, HTTP1: true}, classify.NotSent, classify.EvidenceNothingWritten},
		{"net/http closed the idle connection, cancelled", classify.Facts{Stage: classify.StageAwait, Written: 24,
			Err: errors.New("http: server closed idle connection"), Reused: true, HTTP1: true, Cancelled: true}, classify.Ambiguous, classify.EvidenceBytesWritten},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cat, ev := classify.Failure(tc.facts)
			if cat != tc.wantCat || ev != tc.wantEv {
				t.Fatalf("Failure(%+v) = %v (%v), want %v (%v)", tc.facts, cat, ev, tc.wantCat, tc.wantEv)
			}
		})
	}
}

func TestAttemptErrorMatchesItsCategoryAndUnwrapsItsCause(t *testing.T) {
	cause := syscall.ECONNRESET
	err := error(&classify.Error{Upstream: "u", Stage: classify.StageAwait, Category: classify.Ambiguous,
		Evidence: classify.EvidenceBytesWritten, Err: cause})
	err = fmt.Errorf("call: %w", err)
	if !errors.Is(err, classify.ErrAmbiguous) || errors.Is(err, classify.ErrNotSent) || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("errors.Is does not match the category and the cause: %v", err)
	}
	var ce *classify.Error
	if !errors.As(err, &ce) || ce.Stage != classify.StageAwait {
		t.Fatalf("errors.As: %v", err)
	}
	want := "outbound: u: Ambiguous at await-response (request bytes written, no status): connection reset by peer"
	if ce.Error() != want {
		t.Fatalf("Error() = %q\nwant %q", ce.Error(), want)
	}
}

func TestNamesOfStagesCategoriesAndEvidence(t *testing.T) {
	for v, want := range map[fmt.Stringer]string{
		classify.StageWriteBody: "write-body", classify.Stage(99): "Stage(99)",
		classify.NotSent: "NotSent", classify.Category(0): "Category(0)",
		classify.EvidenceRefusedStream: "REFUSED_STREAM", classify.Evidence(77): "Evidence(77)",
	} {
		if got := v.String(); got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	}
}

func TestInferStage(t *testing.T) {
	write := &net.OpError{Op: "write", Err: syscall.EPIPE}
	readFrom := &net.OpError{Op: "readfrom", Err: fmt.Errorf("copy: %w", write)}
	read := &net.OpError{Op: "read", Err: syscall.ECONNRESET}
	for _, tc := range []struct {
		written int64
		err     error
		want    classify.Stage
	}{
		{0, write, classify.StageWriteHeaders},
		{0, io.EOF, classify.StageWriteHeaders},
		{100, write, classify.StageWriteBody},
		{100, fmt.Errorf("rt: %w", readFrom), classify.StageWriteBody},
		{100, read, classify.StageAwait},
		{100, io.EOF, classify.StageAwait},
	} {
		if got := classify.InferStage(tc.written, tc.err); got != tc.want {
			t.Errorf("InferStage(%d, %v) = %v, want %v", tc.written, tc.err, got, tc.want)
		}
	}
}

// A stream left unanswered at or below the last-stream-id of a graceful
// GOAWAY is the connection's life (the server shut it down); with an error
// code it is a server in trouble.
func TestAnUnansweredStreamBelowAGracefulGoAwayIsLifecycle(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{http2.GoAwayError{LastStreamID: 5, ErrCode: http2.ErrCodeNo}, true},
		{fmt.Errorf("wrapped: %w", http2.GoAwayError{LastStreamID: 5}), true},
		{http2.GoAwayError{LastStreamID: 5, ErrCode: http2.ErrCodeInternal}, false},
		{http2.GoAwayError{LastStreamID: 5, ErrCode: http2.ErrCodeEnhanceYourCalm}, false},
	} {
		f := classify.Facts{Stage: classify.StageAwait, Written: 80, Err: tc.err}
		cat, ev := classify.Failure(f)
		if cat != classify.Ambiguous || ev != classify.EvidenceGoAwayAtOrBelow || classify.Lifecycle(f, ev) != tc.want {
			t.Errorf("%v: %v (%v), lifecycle %v, want Ambiguous, at or below, lifecycle %v", tc.err, cat, ev, classify.Lifecycle(f, ev), tc.want)
		}
	}
}
