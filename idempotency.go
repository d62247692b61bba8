package outbound

import (
	"crypto/rand"
	"fmt"
)

// newIdempotencyKey returns a random (version 4) UUID as a String structured
// field (RFC 8941), the form the IETF httpapi Idempotency-Key draft gives:
// "8e03978e-40d5-43e8-bc93-6894a57f9324", quotes included.
func newIdempotencyKey() string {
	var u [16]byte
	_, _ = rand.Read(u[:]) // crypto/rand.Read never fails (Go 1.24+)
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return fmt.Sprintf(`"%x-%x-%x-%x-%x"`, u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}
