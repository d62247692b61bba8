package metrics_test

import (
	"testing"

	"github.com/outboundhq/outbound/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }
