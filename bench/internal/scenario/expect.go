package scenario

import (
	"regexp"
	"strconv"
	"testing"
)

// Expect is a harness test's check of a scenario's output: it fails t
// for each pattern that out does not match, and for each group of a
// match that is not a number > 0 (a pattern without a group must just
// match).
func Expect(t testing.TB, out string, patterns []string) {
	t.Helper()
	for _, pat := range patterns {
		m := regexp.MustCompile(pat).FindStringSubmatch(out)
		if m == nil {
			t.Errorf("no match for %q in:\n%s", pat, out)
			continue
		}
		for _, g := range m[1:] {
			if n, err := strconv.Atoi(g); err != nil || n <= 0 {
				t.Errorf("%q: %q, want a number > 0 in:\n%s", pat, g, out)
			}
		}
	}
}
