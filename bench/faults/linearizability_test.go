package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardhost/shardhost/runner/runnertest/linearize"
)

// A kept register history can be checked again: a stale read is reported
// with its register and visualization, a correct history passes.
func TestCheckRegistersAgainFromAKeptHistory(t *testing.T) {
	op := func(kind linearize.Kind, v, res, call, ret int64) linearize.Op {
		return linearize.Op{Entity: "g1", Kind: kind, Value: v, Result: res, Outcome: linearize.OK, Call: call, Return: ret}
	}
	good := []linearize.Op{op(linearize.Write, 1, 0, 1, 2), op(linearize.Write, 2, 0, 3, 4), op(linearize.Read, 0, 2, 5, 6)}
	bad := append(good[:2:2], op(linearize.Read, 0, 1, 5, 6))
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		h    []linearize.Op
		code int
	}{{"good", good, 0}, {"bad", bad, 1}} {
		path := filepath.Join(dir, tc.name+".jsonl")
		if err := writeRegisters(path, tc.h); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		if code := run([]string{"-check-registers", path}, &out, &errOut); code != tc.code {
			t.Errorf("%s: exit code %d, want %d\n%s%s", tc.name, code, tc.code, out.String(), errOut.String())
		}
		html := filepath.Join(dir, tc.name+".html")
		_, err := os.Stat(html)
		if tc.code == 1 && (err != nil || !strings.Contains(out.String(), "not linearizable: g1")) {
			t.Errorf("%s: output %q, visualization %v; want g1 reported and %s written", tc.name, out.String(), err, html)
		}
		if tc.code == 0 && err == nil {
			t.Errorf("%s: a visualization was written for a linearizable history", tc.name)
		}
	}
}
