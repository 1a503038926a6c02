package postgres

// payload reads a message's key, value or header element from a text, varchar, bytea, json or
// jsonb column, as the bytes Kafka is to get: text as its UTF-8 bytes, bytea byte for byte,
// json and jsonb as their JSON text. A Go string holds any bytes, so OutboxRecord keeps its
// string fields whatever the column type. valid is false for NULL.
type payload struct {
	s     string
	valid bool
}

// ScanBytes implements pgx's BytesScanner, which the text, bytea, json and jsonb codecs all
// support; v is the column's bytes (jsonb's without its version byte), nil for NULL, and is
// only valid during the call, hence the copy.
func (p *payload) ScanBytes(v []byte) error {
	*p = payload{s: string(v), valid: v != nil}
	return nil
}
