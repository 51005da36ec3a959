package scenario

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

// TestRunExitCodes: Run runs "all" in order, one scenario by name, exits
// 1 at the first failing scenario (its error on stderr, the later ones not
// run) and 2 for a name that is not a scenario.
func TestRunExitCodes(t *testing.T) {
	var ran []string
	scenarios := map[string]func(context.Context, int, io.Writer) error{
		"a": func(_ context.Context, p int, w io.Writer) error {
			ran = append(ran, "a")
			fmt.Fprintf(w, "p=%d\n", p)
			return nil
		},
		"b":    func(context.Context, int, io.Writer) error { ran = append(ran, "b"); return nil },
		"fail": func(context.Context, int, io.Writer) error { ran = append(ran, "fail"); return errors.New("boom") },
	}
	for _, tc := range []struct {
		which, order string
		code         int
		ran          string
		stdout       []string
		stderr       string
	}{
		{"all", "a b", 0, "a b", []string{"== a\np=7\n   (0s)\n== b\n"}, ""},
		{"b", "a b", 0, "b", []string{"== b\n"}, ""},
		{"all", "a fail b", 1, "a fail", []string{"== fail\n"}, `prog: fail: boom`},
		{"nope", "a b", 2, "", nil, `prog: unknown scenario "nope"`},
	} {
		ran = nil
		var stdout, stderr bytes.Buffer
		code := Run(context.Background(), "prog", tc.which, strings.Fields(tc.order), scenarios, 7, &stdout, &stderr)
		if code != tc.code || strings.Join(ran, " ") != tc.ran {
			t.Errorf("%s of %q: exit %d, ran %q; want %d, %q", tc.which, tc.order, code, ran, tc.code, tc.ran)
		}
		for _, want := range tc.stdout {
			if !strings.Contains(stdout.String(), want) {
				t.Errorf("%s of %q: stdout %q lacks %q", tc.which, tc.order, stdout.String(), want)
			}
		}
		if !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("%s of %q: stderr %q lacks %q", tc.which, tc.order, stderr.String(), tc.stderr)
		}
	}
}

// errorsOf records the failures Expect reports.
type errorsOf struct {
	testing.TB
	msgs []string
}

func (e *errorsOf) Helper() {}
func (e *errorsOf) Errorf(format string, args ...any) {
	e.msgs = append(e.msgs, fmt.Sprintf(format, args...))
}

// TestExpectChecksMatchesAndPositiveNumbers: Expect accepts a matching
// pattern whose groups are numbers > 0, and reports a pattern without a
// match and a group that is 0 or not a number.
func TestExpectChecksMatchesAndPositiveNumbers(t *testing.T) {
	out := "registered 200 in 1s, 0 failed; p50 3 ms\n"
	for _, tc := range []struct {
		pattern string
		fails   bool
	}{
		{`registered (\d+) in`, false},
		{`0 failed; p50 (\d+) ms`, false},
		{`, 0 failed`, false},
		{`(\d+) failed`, true},  // 0
		{`p50 (\w+) ms`, false}, // "3"
		{`registered (\w+) in`, false},
		{`in (\w+),`, true}, // "1s": not a number
		{`no such line`, true},
	} {
		var e errorsOf
		Expect(&e, out, []string{tc.pattern})
		if got := len(e.msgs) > 0; got != tc.fails {
			t.Errorf("pattern %q: failed %v (%q), want %v", tc.pattern, got, e.msgs, tc.fails)
		}
	}
}
