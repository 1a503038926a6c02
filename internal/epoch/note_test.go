package epoch

import (
	"math"
	"slices"
	"testing"
)

func TestNoteRoundTrip(t *testing.T) {
	cases := [][]int64{
		nil,
		{1},
		{5, 3, 4, 3}, // unsorted, with a repeat
		{1, 1 << 40, math.MaxInt64},
	}
	for _, ids := range cases {
		got, err := DecodeNote(EncodeNote(ids))
		if err != nil {
			t.Fatalf("%v: %v", ids, err)
		}
		want := slices.Compact(slices.Sorted(slices.Values(ids)))
		if !slices.Equal(got, want) {
			t.Errorf("round trip of %v gave %v, want %v", ids, got, want)
		}
	}
}

// However far apart the ids, a full note fits Kafka's default offset.metadata.max.bytes.
func TestFullNoteFitsOffsetMetadata(t *testing.T) {
	ids := make([]int64, MaxNotedRecords)
	for i := range ids {
		ids[i] = math.MaxInt64 / MaxNotedRecords * int64(i+1)
	}
	if n := len(EncodeNote(ids)); n > 4096 {
		t.Fatalf("a note of %d widely spread ids takes %d bytes; Kafka allows 4096", len(ids), n)
	}
}

func TestDecodeNoteRejectsForeignMetadata(t *testing.T) {
	for _, note := range []string{"some consumer's metadata", notePrefix + "!!", notePrefix + "gA"} {
		if _, err := DecodeNote(note); err == nil {
			t.Errorf("DecodeNote(%q) succeeded", note)
		}
	}
	if ids, err := DecodeNote(""); err != nil || ids != nil {
		t.Errorf(`DecodeNote("") = %v, %v; want nothing`, ids, err)
	}
}
