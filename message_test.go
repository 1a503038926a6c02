package goharvest

import (
	"strings"
	"testing"
)

func TestIDHeaderConfig(t *testing.T) {
	c, err := Unmarshal([]byte("idHeader: goharvest-id\n"))
	if err != nil || c.IDHeader != "goharvest-id" {
		t.Fatalf("got %q, %v", c.IDHeader, err)
	}
	validConfig := func() Config { return Config{LeaderGroupID: "g", LeaderTopic: "t", Name: "test"}.WithDefaults() }
	if c := validConfig(); c.IDHeader != "" || c.Validate() != nil {
		t.Fatalf("the default is %q (%v), want empty: no id header", c.IDHeader, c.Validate())
	}
	for _, bad := range []string{" id", "id\x00", "\xff"} {
		c := validConfig()
		c.IDHeader = bad
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "IDHeader (idHeader)") {
			t.Errorf("IDHeader %q: got %v, want an error naming IDHeader (idHeader)", bad, err)
		}
	}
}
