package reaper

import (
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/outbox"
)

// Outbox is one outbox the reaper publishes: its name and its harvester's settings.
//
// In a file that lists outboxes (outboxes:), each entry's keys are those of Settings plus
// `outbox:`, its name; they are merged over harvest:, which then holds what the outboxes share
// (the Kafka settings, say). Mappings merge key by key, so an entry may override one Kafka
// property or one limit and keep the rest. `name` keeps its meaning of goharvest.Config (this
// harvester's name in its group), which is why the outbox's own name has a key of its own.
//
// A file with harvest: alone has one outbox, named after its table, as before outboxes: existed.
type Outbox struct {
	Name    string   `yaml:"outbox"`
	Harvest Settings `yaml:",inline"`
	// Line is the entry's line in the file; 0 for the outbox of a harvest:-only file.
	Line int `yaml:"-"`
}

// where names an outbox in errors and logs: by name, and by line when the file lists it.
func (o Outbox) where() string {
	if o.Line == 0 {
		return fmt.Sprintf("outbox %q", o.Name)
	}
	return fmt.Sprintf("line %d: outbox %q", o.Line, o.Name)
}

// expandedKeys are the keys of Settings whose string values may name environment
// variables, beside every string value of the two Kafka maps.
var expandedKeys = map[string]bool{"dataSource": true, "listenDataSource": true, "outboxTable": true,
	"leaderTopic": true, "leaderGroupID": true, "name": true, "outbox": true}

// expandHarvest expands the environment variables in a mapping of Settings' keys (harvest:
// or an entry of outboxes:), path naming it in errors.
func expandHarvest(n *yaml.Node, path string, expand func(path string, value *yaml.Node)) {
	eachPair(n, func(key string, value *yaml.Node) {
		switch {
		case expandedKeys[key] && value.Kind == yaml.ScalarNode:
			expand(path+"."+key, value)
		case key == "baseKafkaConfig" || key == "producerKafkaConfig":
			eachPair(value, func(property string, v *yaml.Node) {
				// Only strings: a number or a boolean stays what YAML made it.
				if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!str" {
					expand(path+"."+key+"."+property, v)
				}
			})
		}
	})
}

// eachPair calls f with each key and value of mapping n (nothing when n is not a mapping).
func eachPair(n *yaml.Node, f func(key string, value *yaml.Node)) {
	if n == nil || n.Kind != yaml.MappingNode {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		f(n.Content[i].Value, n.Content[i+1])
	}
}

// lookup returns the value of key in mapping n, or nil.
func lookup(n *yaml.Node, key string) *yaml.Node {
	var found *yaml.Node
	eachPair(n, func(k string, v *yaml.Node) {
		if k == key {
			found = v
		}
	})
	return found
}

// merge returns a mapping holding base's keys with over's merged over them: a key in both whose
// values are both mappings is merged in turn, so that an outbox can override one Kafka property
// or one limit; any other value of over replaces base's. Neither argument is modified.
func merge(base, over *yaml.Node) *yaml.Node {
	out := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	if base != nil && base.Kind == yaml.MappingNode {
		out.Content = slices.Clone(base.Content)
	}
	eachPair(over, func(key string, value *yaml.Node) {
		for i := 0; i+1 < len(out.Content); i += 2 {
			if out.Content[i].Value == key {
				if old := out.Content[i+1]; old.Kind == yaml.MappingNode && value.Kind == yaml.MappingNode {
					value = merge(old, value)
				}
				out.Content[i+1] = value
				return
			}
		}
		out.Content = append(out.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, value)
	})
	return out
}

// resolveOutboxes makes the outboxes an outboxes: sequence lists, each entry merged over the
// harvest: mapping shared. Both have had their environment expanded.
func resolveOutboxes(shared, entries *yaml.Node, defaultName string) ([]Outbox, []error) {
	if entries.Kind != yaml.SequenceNode || len(entries.Content) == 0 {
		return nil, []error{fmt.Errorf("line %d: outboxes: lists no outbox; list one or more, or remove the key and configure one under harvest:", entries.Line)}
	}
	// Every outbox's harvester is named after the reaper's (harvest.name, or the default made
	// of host, process and time) and the outbox, so that each has its own series (label
	// harvest) and alerting rules can tell them apart.
	reaperName := sharedName(shared)
	if reaperName == "" {
		reaperName = defaultName
	}
	var outboxes []Outbox
	var errs []error
	for _, entry := range entries.Content {
		withoutName := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		eachPair(entry, func(key string, value *yaml.Node) {
			if key != "outbox" {
				withoutName.Content = append(withoutName.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, value)
			}
		})
		o := Outbox{Line: entry.Line}
		if name := lookup(entry, "outbox"); name != nil {
			o.Name = name.Value
		}
		if err := outbox.CheckName(o.Name); err != nil {
			// The name makes the default election group and leader topic, so Kafka's rule for
			// names applies.
			errs = append(errs, fmt.Errorf("line %d: outboxes: entry's outbox (its name): %q: %w", entry.Line, o.Name, err))
			continue
		}
		if err := merge(shared, withoutName).Decode(&o.Harvest); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", o.where(), err))
			continue
		}
		h := &o.Harvest
		if h.LeaderGroupID == "" {
			h.LeaderGroupID = o.Name
		}
		if h.LeaderTopic == "" {
			h.LeaderTopic = goharvest.DefaultLeaderTopicPrefix + h.LeaderGroupID
		}
		if lookup(entry, "name") == nil {
			h.Name = reaperName + "." + o.Name
		}
		outboxes = append(outboxes, o)
	}
	return outboxes, append(errs, conflicts(outboxes)...)
}

// sharedName is harvest.name, or "" when harvest: does not set it.
func sharedName(shared *yaml.Node) string {
	if n := lookup(shared, "name"); n != nil {
		return n.Value
	}
	return ""
}

// conflicts refuses outboxes that would share what each must have alone: a name (which the
// commands and the admin endpoints go by), an election group (its members lead its shards and
// own its transactional IDs, goharvest.<group>.<shard>: two outboxes in one group would fence
// each other's producers), a leader topic (whose partitions are the shards of one outbox), a
// table (two harvesters' marks and purges of one table would break its order), or a
// harvester's name (the label that tells the outboxes' series apart).
func conflicts(outboxes []Outbox) []error {
	var errs []error
	type claim struct{ what, value string }
	first := map[claim]Outbox{}
	for _, o := range outboxes {
		h := o.Harvest.WithDefaults()
		for _, c := range []claim{
			{"name", o.Name},
			{"leaderGroupID", h.LeaderGroupID},
			{"leaderTopic", h.LeaderTopic},
			{"table", h.tableIdentity()},
			{"harvester name (name)", h.Name},
		} {
			if other, taken := first[c]; taken {
				errs = append(errs, fmt.Errorf("%s: its %s %s is also that of outbox %q (line %d); each outbox needs its own",
					o.where(), c.what, c.value, other.Name, other.Line))
				continue
			}
			first[c] = o
		}
	}
	return errs
}

// pick returns the outbox a command names with -outbox, or the only one when name is empty.
func (f File) pick(name string) (Outbox, error) {
	if name == "" && len(f.Outboxes) == 1 {
		return f.Outboxes[0], nil
	}
	for _, o := range f.Outboxes {
		if o.Name == name {
			return o, nil
		}
	}
	if name == "" {
		return Outbox{}, fmt.Errorf("the file lists %d outboxes; name one with -outbox: %s", len(f.Outboxes), f.names())
	}
	return Outbox{}, fmt.Errorf("-outbox %q: the file lists no such outbox; it lists %s", name, f.names())
}

// names lists the outboxes' names for errors.
func (f File) names() string {
	names := make([]string, len(f.Outboxes))
	for i, o := range f.Outboxes {
		names[i] = o.Name
	}
	return strings.Join(names, ", ")
}

// selected returns every outbox, or the one -outbox names.
func (f File) selected(name string) ([]Outbox, error) {
	if name == "" {
		return f.Outboxes, nil
	}
	o, err := f.pick(name)
	return []Outbox{o}, err
}
