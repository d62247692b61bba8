package cfgerr_test

import (
	"errors"
	"testing"

	"github.com/outboundhq/outbound/internal/cfgerr"
)

func TestAnErrorIsNamedByItsPathFromTheOutermostConfig(t *testing.T) {
	err := cfgerr.New("ratelimit", "Burst", "must be >= 0, got %d", -1)
	err = cfgerr.In("admission", "Rate", err)
	err = cfgerr.In("attempt", "Admission", err)
	err = cfgerr.In("outbound", "", err)
	if got, want := err.Error(), "outbound: Config.Admission.Rate.Burst must be >= 0, got -1"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
	other := errors.New("not a field")
	if cfgerr.In("outbound", "X", other) != other {
		t.Fatal("an error that names no field is changed")
	}
}
