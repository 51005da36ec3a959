package ownership

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/shardhost/shardhost/runner"
)

// LastEvents lists the last n events of every runner in evs, by runner
// (IDs sorted), one line each ([EventLine]): what a failed test prints of
// the runners involved.
func LastEvents(evs []runner.Event, n int) string {
	byRunner := map[string][]runner.Event{}
	for _, ev := range evs {
		id := ev.Base().Runner
		byRunner[id] = append(byRunner[id], ev)
	}
	if len(byRunner) == 0 {
		return "no runner events recorded"
	}
	var b strings.Builder
	for _, id := range slices.Sorted(maps.Keys(byRunner)) {
		es := byRunner[id]
		fmt.Fprintf(&b, "last %d of %d events of runner %s:\n", min(n, len(es)), len(es), id)
		for _, ev := range es[max(0, len(es)-n):] {
			fmt.Fprintf(&b, "  %s\n", EventLine(ev))
		}
	}
	return b.String()
}

// EventLine formats an event: its time (to the microsecond), its type and
// its fields but the runner and time every event has.
func EventLine(ev runner.Event) string {
	v := reflect.ValueOf(ev)
	var fields []string
	if v.Kind() == reflect.Struct {
		for i := range v.NumField() {
			if f := v.Type().Field(i); !f.Anonymous {
				fields = append(fields, fmt.Sprintf("%s=%v", f.Name, v.Field(i)))
			}
		}
	}
	return fmt.Sprintf("%s %T{%s}", ev.Base().Time.Format("15:04:05.000000"), ev, strings.Join(fields, " "))
}
