package outbox

import (
	"errors"
	"fmt"
	"strings"
)

// MaxNameLen is the longest topic name Kafka accepts.
const MaxNameLen = 249

// NameChar reports whether Kafka allows r in a topic name: ASCII letters, digits, '.', '_', '-'.
func NameChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
}

// CheckName says what is wrong with name as a Kafka topic name, or returns nil. goharvest holds
// the consumer group IDs it makes topics and groups from to the same rule. This is the one copy
// of the rule: the stasher checks records with it before they are written, the harvester before
// it sends them, and the configuration checks the leader topic and group.
func CheckName(name string) error {
	switch {
	case name == "":
		return errors.New("empty: use 1 to 249 letters, digits, '.', '_' or '-'")
	case len(name) > MaxNameLen:
		return fmt.Errorf("%d characters: Kafka allows at most %d", len(name), MaxNameLen)
	case name == "." || name == "..":
		return fmt.Errorf("%q is not allowed: Kafka reserves it", name)
	case strings.IndexFunc(name, func(r rune) bool { return !NameChar(r) }) >= 0:
		return errors.New("use only letters, digits, '.', '_' and '-'")
	}
	return nil
}
