// Package strictyaml decodes YAML configuration strictly: an unknown key, a value of the wrong
// type or a duration written as a bare number is an error that names the key's full path and
// its line, so that a misspelt setting is never silently ignored.
package strictyaml

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Unmarshal decodes data into out, rejecting keys that out has no field for. An empty document
// leaves out unchanged.
func Unmarshal(data []byte, out any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(out)
	if err == nil || errors.Is(err, io.EOF) {
		return nil
	}
	var typeErr *yaml.TypeError
	if !errors.As(err, &typeErr) {
		return err
	}
	paths := keyPaths(data)
	msgs := make([]string, len(typeErr.Errors))
	for i, msg := range typeErr.Errors {
		msgs[i] = describe(msg, paths)
	}
	return errors.New(strings.Join(msgs, "; "))
}

var (
	linePrefix   = regexp.MustCompile(`^line (\d+): `)
	unknownField = regexp.MustCompile(`^field (\S+) not found in type \S+$`)
)

// describe rewrites one of yaml.v3's messages, which give a line number and a Go type, into one
// that names the key a person wrote.
func describe(msg string, paths map[int]string) string {
	m := linePrefix.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	line, _ := strconv.Atoi(m[1])
	rest := msg[len(m[0]):]
	path := paths[line]
	if path == "" {
		return msg
	}
	if u := unknownField.FindStringSubmatch(rest); u != nil {
		return fmt.Sprintf("line %d: unknown key %q", line, path)
	}
	return fmt.Sprintf("line %d: %s: %s", line, path, rest)
}

// Lines maps each key's dotted path (such as "harvest.limits.pollDuration") to the line it is on,
// so that errors found after decoding can still name a line.
func Lines(data []byte) map[string]int {
	lines := map[string]int{}
	for line, path := range keyPaths(data) {
		if old, ok := lines[path]; !ok || line < old {
			lines[path] = line
		}
	}
	return lines
}

// keyPaths maps each line that holds a mapping key to that key's dotted path, e.g.
// "harvest.limits.pollDuration". A line with a key and a scalar value names that key.
func keyPaths(data []byte) map[int]string {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil
	}
	paths := map[int]string{}
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		switch n.Kind {
		case yaml.DocumentNode, yaml.SequenceNode:
			for _, c := range n.Content {
				walk(c, prefix)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				key, value := n.Content[i], n.Content[i+1]
				path := key.Value
				if prefix != "" {
					path = prefix + "." + key.Value
				}
				paths[key.Line] = path
				if value.Line != key.Line {
					// A scalar on its own line still belongs to this key.
					if _, taken := paths[value.Line]; !taken && value.Kind == yaml.ScalarNode {
						paths[value.Line] = path
					}
				}
				walk(value, path)
			}
		}
	}
	walk(&root, "")
	return paths
}
