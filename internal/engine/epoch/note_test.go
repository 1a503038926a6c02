package epoch

import (
	"cmp"
	"encoding/base64"
	"encoding/binary"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/outbox"
	"github.com/google/uuid"
)

func TestNoteRoundTrip(t *testing.T) {
	cases := [][]Noted{
		nil,
		{{ID: 1, Fingerprint: 7}},
		{{ID: 5, Fingerprint: 1}, {ID: 3, Fingerprint: 2}, {ID: 4}, {ID: 3, Fingerprint: 2}}, // unsorted, with a repeat
		{{ID: 1, Fingerprint: math.MaxUint32}, {ID: 1 << 40}, {ID: math.MaxInt64, Fingerprint: 1 << 31}},
	}
	for _, records := range cases {
		got, err := DecodeNote(EncodeNote(records))
		if err != nil {
			t.Fatalf("%v: %v", records, err)
		}
		want := slices.Clone(records)
		slices.SortFunc(want, func(a, b Noted) int { return cmp.Compare(a.ID, b.ID) })
		want = slices.CompactFunc(want, func(a, b Noted) bool { return a.ID == b.ID })
		for i := range want {
			want[i].Fingerprinted = true
		}
		if !slices.Equal(got, want) {
			t.Errorf("round trip of %v gave %v, want %v", records, got, want)
		}
	}
}

// A note of format 1, written by an earlier release, still reads: ids without fingerprints.
func TestNoteOfFormatOneReads(t *testing.T) {
	// 3, 4 and 1<<40 as varint deltas.
	buf := binary.AppendUvarint(binary.AppendUvarint(binary.AppendUvarint(nil, 3), 1), 1<<40-4)
	got, err := DecodeNote(notePrefixV1 + base64.RawURLEncoding.EncodeToString(buf))
	if err != nil {
		t.Fatal(err)
	}
	if want := []Noted{{ID: 3}, {ID: 4}, {ID: 1 << 40}}; !slices.Equal(got, want) {
		t.Errorf("format 1 note read as %v, want %v", got, want)
	}
}

// However far apart the ids, a full note fits Kafka's default offset.metadata.max.bytes.
func TestFullNoteFitsOffsetMetadata(t *testing.T) {
	records := make([]Noted, MaxNotedRecords)
	for i := range records {
		records[i] = Noted{ID: math.MaxInt64 / MaxNotedRecords * int64(i+1), Fingerprint: math.MaxUint32}
	}
	if n := len(EncodeNote(records)); n > 4096 {
		t.Fatalf("a note of %d widely spread records takes %d bytes; Kafka allows 4096", len(records), n)
	}
}

// A fingerprint tells apart rows that differ in any field that makes the message, or in when
// they were written: what a new row that took a published record's id would differ in.
func TestFingerprintTellsRowsApart(t *testing.T) {
	v, empty := "v", ""
	base := driver.OutboxRecord{ID: 1, CreateTime: time.UnixMicro(1_700_000_000_000_000), KafkaTopic: "t", KafkaKey: "k",
		KafkaValue: &v, KafkaHeaders: outbox.Headers{{Key: "h", Value: "x"}}}
	variants := map[string]func(*driver.OutboxRecord){
		"create time":  func(r *driver.OutboxRecord) { r.CreateTime = r.CreateTime.Add(time.Microsecond) },
		"topic":        func(r *driver.OutboxRecord) { r.KafkaTopic = "u" },
		"key":          func(r *driver.OutboxRecord) { r.KafkaKey = "k2" },
		"empty value":  func(r *driver.OutboxRecord) { r.KafkaValue = &empty },
		"no value":     func(r *driver.OutboxRecord) { r.KafkaValue = nil },
		"header value": func(r *driver.OutboxRecord) { r.KafkaHeaders = outbox.Headers{{Key: "h", Value: "y"}} },
		"no header":    func(r *driver.OutboxRecord) { r.KafkaHeaders = nil },
		"shifted":      func(r *driver.OutboxRecord) { r.KafkaTopic, r.KafkaKey = "tk", "" },
	}
	for name, change := range variants {
		r := base
		change(&r)
		if Fingerprint(r) == Fingerprint(base) {
			t.Errorf("a row with another %s has the same fingerprint", name)
		}
	}
	same := base
	same.ID, same.LeaderID = 2, &uuid.UUID{1}
	if Fingerprint(same) != Fingerprint(base) {
		t.Error("the id or leader_id changed the fingerprint; it is about the row's content")
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
