package classify_test

import (
	"errors"
	"fmt"
	"testing"

	"golang.org/x/net/http2"

	"github.com/outboundhq/outbound/classify"
)

// FuzzFailure classifies failures built from fuzzed facts and error texts,
// and checks that only a proof yields NotSent: no connection, nothing
// written (and not cancelled), a REFUSED_STREAM from a connection that was
// not going away and an upstream trusted to send it, or a stream above a
// GOAWAY.
func FuzzFailure(f *testing.F) {
	f.Add(uint8(7), int64(0), false, "EOF", uint8(0), uint32(0), false, false)
	f.Add(uint8(7), int64(120), false, "http2: Transport received Server's graceful shutdown GOAWAY", uint8(0), uint32(0), false, false)
	f.Add(uint8(7), int64(120), true, "stream error", uint8(1), uint32(7), false, false)
	f.Add(uint8(7), int64(120), false, "server sent GOAWAY", uint8(2), uint32(3), false, false)
	f.Add(uint8(7), int64(120), false, "reset", uint8(1), uint32(7), true, false)
	f.Add(uint8(7), int64(120), false, "reset", uint8(1), uint32(7), false, true)
	f.Add(uint8(7), int64(24), false, "http: server closed idle connection", uint8(0), uint32(0), false, false)
	f.Fuzz(func(t *testing.T, stage uint8, written int64, cancelled bool, text string, kind uint8, code uint32, draining, distrust bool) {
		var err error = errors.New(text)
		switch kind % 4 {
		case 1:
			err = fmt.Errorf("%w: %w", err, http2.StreamError{StreamID: 1, Code: http2.ErrCode(code)})
		case 2:
			err = fmt.Errorf("%w: %w", err, http2.GoAwayError{LastStreamID: code})
		case 3:
			err = fmt.Errorf("wrapped: %w", err)
		}
		facts := classify.Facts{Stage: classify.Stage(stage % 10), Written: written, Err: err, Cancelled: cancelled,
			Draining: draining, DistrustRefused: distrust}
		cat, ev := classify.Failure(facts)
		if cat < classify.LocalRejection || cat > classify.Answered || ev == 0 {
			t.Fatalf("Failure(%+v) = %v, %v", facts, cat, ev)
		}
		if cat != classify.NotSent {
			return
		}
		switch ev {
		case classify.EvidenceNoConnection:
			if !facts.Stage.Connecting() {
				t.Fatalf("no connection at stage %v", facts.Stage)
			}
		case classify.EvidenceNothingWritten:
			if written != 0 && !classify.NothingWritten(err) || cancelled {
				t.Fatalf("nothing written with %d bytes written, cancelled %v: %v", written, cancelled, err)
			}
		case classify.EvidenceRefusedStream:
			var se http2.StreamError
			if !errors.As(err, &se) || se.Code != http2.ErrCodeRefusedStream {
				t.Fatalf("REFUSED_STREAM without one: %v", err)
			}
			if draining || distrust {
				t.Fatalf("REFUSED_STREAM taken as proof, draining %v, distrusted %v", draining, distrust)
			}
		case classify.EvidenceGoAwayAbove:
			// Only the exact texts of Go's transport count.
		default:
			t.Fatalf("NotSent on evidence %v", ev)
		}
	})
}

// FuzzInferStage: any error, any count, a stage that locates a request on a
// connection.
func FuzzInferStage(f *testing.F) {
	f.Add(int64(0), "write: broken pipe")
	f.Add(int64(10), "read: connection reset")
	f.Fuzz(func(t *testing.T, written int64, text string) {
		s := classify.InferStage(written, errors.New(text))
		if s != classify.StageWriteHeaders && s != classify.StageWriteBody && s != classify.StageAwait {
			t.Fatalf("InferStage = %v", s)
		}
		if (written == 0) != (s == classify.StageWriteHeaders) {
			t.Fatalf("InferStage(%d) = %v", written, s)
		}
	})
}
