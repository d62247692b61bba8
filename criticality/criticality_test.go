package criticality_test

import (
	"context"
	"testing"

	"github.com/outboundhq/outbound/criticality"
)

func TestALevelTravelsInTheContextAndIsClamped(t *testing.T) {
	ctx := context.Background()
	if criticality.Of(ctx) != criticality.Default || criticality.Of(nil) != criticality.Default { //nolint:staticcheck // a nil context is Default
		t.Fatal("an unmarked context is not Default")
	}
	for l, want := range map[criticality.Level]criticality.Level{
		criticality.Sheddable: criticality.Sheddable, criticality.Critical: criticality.Critical, 7: criticality.Critical, -9: criticality.Sheddable,
	} {
		if got := criticality.Of(criticality.With(ctx, l)); got != want {
			t.Errorf("With(%d): %v, want %v", l, got, want)
		}
	}
	if s := criticality.Sheddable.String() + " " + criticality.Default.String() + " " + criticality.Critical.String() + " " + criticality.Level(5).String(); s != "sheddable default critical Level(5)" {
		t.Errorf("names: %q", s)
	}
}
