package outbox

import (
	"strings"
	"testing"
)

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"orders", "a.b_c-D9", strings.Repeat("x", 249), "..."} {
		if err := CheckName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", strings.Repeat("x", 250), "has space", "ümlaut", "a/b", "a\x00"} {
		if err := CheckName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
