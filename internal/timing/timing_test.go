package timing

import (
	"strings"
	"testing"
	"time"
)

func TestDefaultsAreInRange(t *testing.T) {
	if p := (Election{}).WithDefaults().Problems(); len(p) > 0 {
		t.Errorf("the defaults are out of range: %v", p)
	}
}

func TestProblemsNameTheField(t *testing.T) {
	cases := []struct {
		e     Election
		field string
		want  string
	}{
		{Election{HeartbeatTimeout: 50 * time.Millisecond, MinPollInterval: 10 * time.Millisecond}, "HeartbeatTimeout", "[100ms, 10m0s]"},
		{Election{HeartbeatTimeout: 11 * time.Minute}, "HeartbeatTimeout", "[100ms, 10m0s]"},
		{Election{PollDuration: time.Microsecond, MinPollInterval: time.Millisecond}, "PollDuration", "[1ms, 10m0s]"},
		{Election{PollDuration: 200 * time.Millisecond}, "MinPollInterval", "at least pollDuration"},
		{Election{HeartbeatTimeout: time.Second, MinPollInterval: 500 * time.Millisecond}, "MinPollInterval", "below half of heartbeatTimeout"},
	}
	for _, tc := range cases {
		problems := tc.e.WithDefaults().Problems()
		if len(problems) != 1 || problems[0].Field != tc.field || !strings.Contains(problems[0].Reason, tc.want) {
			t.Errorf("%+v: problems %v; want one for %s saying %q", tc.e, problems, tc.field, tc.want)
		}
	}
	// The bound below half a heartbeat timeout is inclusive at a millisecond below.
	e := Election{HeartbeatTimeout: time.Second, MinPollInterval: MaxMinPollInterval(time.Second)}.WithDefaults()
	if p := e.Problems(); len(p) > 0 {
		t.Errorf("MinPollInterval %v refused: %v", e.MinPollInterval, p)
	}
}
