// Package doctable reads the metrics table of the documentation
// (docs/observability.md, and the package documentation of runner): the
// instruments a runner creates, each with its kind and unit. The tests
// that hold the documentation to the code and to what a Prometheus scrape
// shows read it through here.
package doctable

import (
	"fmt"
	"regexp"
	"strings"
)

// Instrument is what the documentation says of one instrument.
type Instrument struct {
	// Kind is counter, gauge, gauge (observed) or histogram.
	Kind string
	// Unit is its UCUM unit as the code gives it: s, {shard}, ...
	Unit string
}

// ObservabilityRow matches a row of docs/observability.md's metrics
// table: name, kind, unit.
var ObservabilityRow = regexp.MustCompile("(?m)^\\| `(sharding\\.[a-z_]+)` \\| ([a-z ()]+) \\| `([^`]+)` \\|")

// Parse returns the rows of a documentation table whose row expression
// captures name, kind and unit; a name documented twice is an error.
func Parse(text string, row *regexp.Regexp) (map[string]Instrument, error) {
	out := map[string]Instrument{}
	for _, m := range row.FindAllStringSubmatch(text, -1) {
		if _, dup := out[m[1]]; dup {
			return out, fmt.Errorf("%s documented twice", m[1])
		}
		out[m[1]] = Instrument{Kind: strings.TrimSpace(m[2]), Unit: m[3]}
	}
	return out, nil
}
