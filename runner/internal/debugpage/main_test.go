package debugpage

import (
	"testing"

	"go.uber.org/goleak"
)

// Peer fetches run on goroutines of their own: none may outlive a request.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
