// Package scenario runs the named scenarios of a bench harness (the
// programs under bench/ that measure one guarantee each way they can),
// with the output format they share: "== name", the scenario's own lines,
// then its duration.
package scenario

import (
	"context"
	"fmt"
	"io"
	"time"
)

// Run runs the scenario named which ("all": every one in order) of the
// program prog with p, and returns the program's exit code: 0 when every
// scenario it ran succeeded, 1 on the first one that failed (its error on
// stderr), 2 for a name that is neither "all" nor a scenario.
func Run[P any](ctx context.Context, prog, which string, order []string, scenarios map[string]func(context.Context, P, io.Writer) error, p P, stdout, stderr io.Writer) int {
	if which != "all" {
		if scenarios[which] == nil {
			fmt.Fprintf(stderr, "%s: unknown scenario %q\n", prog, which)
			return 2
		}
		order = []string{which}
	}
	for _, name := range order {
		start := time.Now()
		fmt.Fprintf(stdout, "== %s\n", name)
		if err := scenarios[name](ctx, p, stdout); err != nil {
			fmt.Fprintf(stderr, "%s: %s: %v\n", prog, name, err)
			return 1
		}
		fmt.Fprintf(stdout, "   (%v)\n", time.Since(start).Round(time.Second))
	}
	return 0
}
