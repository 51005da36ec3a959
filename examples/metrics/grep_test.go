package metrics_test

import (
	"slices"
	"strings"
)

// grep returns the sample lines (not # HELP or # TYPE) of the exposition
// text whose metric name is one of names, sorted.
func grep(text string, names ...string) []string {
	var out []string
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		if slices.Contains(names, name) {
			out = append(out, line)
		}
	}
	slices.Sort(out)
	return out
}
