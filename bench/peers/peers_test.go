package main

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"
)

// TestEveryAdapterAnswersAsksCorrectly starts each system's local and
// remote mode and checks that asks return the counts the harness expects,
// that tells are all processed, and that activations are all counted.
func TestEveryAdapterAnswersAsksCorrectly(t *testing.T) {
	for _, sys := range allSystems() {
		t.Run(sys.name, func(t *testing.T) {
			asks := func(a asker) {
				t.Helper()
				for id := range 2 {
					if err := a.Ask(id, func(ask func() error) error {
						for range 3 {
							if err := ask(); err != nil {
								return err
							}
						}
						return nil
					}); err != nil {
						t.Fatalf("Ask(%d): %v", id, err)
					}
				}
			}
			if sys.newLocal != nil {
				l, err := sys.newLocal()
				if err != nil {
					t.Fatal(err)
				}
				asks(l)
				if err := l.Tell(1000); err != nil {
					t.Errorf("Tell(1000): %v", err)
				}
				var sk *skipError // an adapter may skip a scenario, saying why
				if err := l.Activate(100); err != nil && !errors.As(err, &sk) {
					t.Errorf("Activate(100): %v", err)
				}
				l.Close()
			}
			if sys.newRemote != nil {
				r, err := sys.newRemote()
				if err != nil {
					t.Fatal(err)
				}
				asks(r)
				r.Close()
			}
		})
	}
}

func TestCounterCheckRejectsAWrongCount(t *testing.T) {
	var c counterCheck
	if err := c.check(1); err != nil {
		t.Fatalf("check(1) after no ask = %v, want nil", err)
	}
	if err := c.check(3); err == nil {
		t.Fatal("check(3) after one ask = nil, want an error")
	}
}

func TestSummarizeGivesMediansSpreadAndRatios(t *testing.T) {
	r := row{Metric: "m", Unit: "asks/s", Higher: true, Cells: map[string]*cell{
		"shardhost": {Samples: []float64{3, 1, 2}},
		"peer":      {Samples: []float64{8, 2, 4, 6}},
		"skipped":   {Skip: "no mode"},
	}}
	r.summarize()
	for _, tc := range []struct {
		sys                     string
		median, min, max, ratio float64
	}{
		{"shardhost", 2, 1, 3, 1},
		{"peer", 5, 2, 8, 2.5},
		{"skipped", 0, 0, 0, 0},
	} {
		c := r.Cells[tc.sys]
		if c.Median != tc.median || c.Min != tc.min || c.Max != tc.max || c.Ratio != tc.ratio {
			t.Errorf("%s: median %v min %v max %v ratio %v, want %v %v %v %v",
				tc.sys, c.Median, c.Min, c.Max, c.Ratio, tc.median, tc.min, tc.max, tc.ratio)
		}
	}
}

func TestTableShowsRatiosSkipsAndErrors(t *testing.T) {
	res := &results{
		Systems: []string{"shardhost", "peer", "floor"},
		Rows: []row{{Metric: "ask", Unit: "asks/s", Higher: true, Cells: map[string]*cell{
			"shardhost": {Samples: []float64{2e6}},
			"peer":      {Samples: []float64{5e5}},
			"floor":     {Skip: "a network floor only"},
		}}},
		Skips:  map[string][]string{"floor": {"ask64: a network floor only"}},
		Errors: map[string][]string{"peer": {"round 2 ask64: boom"}},
		Rounds: 1,
	}
	res.Rows[0].summarize()
	var b bytes.Buffer
	writeTable(&b, res)
	out := b.String()
	for _, want := range []string{"| 2.00 M ", "| 500 k (0.25x) ", "| - ", "a network floor only", "round 2 ask64: boom"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestPickKeepsOrderAndRejectsUnknownNames(t *testing.T) {
	names := func(s system) string { return s.name }
	got, err := pick(allSystems(), "tcp,shardhost", names)
	if err != nil || len(got) != 2 || got[0].name != "tcp" || got[1].name != "shardhost" {
		t.Fatalf("pick(tcp,shardhost) = %v, %v", got, err)
	}
	if _, err := pick(allSystems(), "akka", names); err == nil {
		t.Fatal("pick(akka) = nil error, want one")
	}
}

func TestSavedRunPrintsTheSameTable(t *testing.T) {
	res := &results{Systems: []string{"shardhost", "peer"}, Rounds: 3, Rows: []row{{Metric: "tell", Unit: "msgs/s", Higher: true,
		Cells: map[string]*cell{"shardhost": {Samples: []float64{1e6, 3e6, 2e6}}, "peer": {Samples: []float64{4e6}}}}}}
	res.Rows[0].summarize()
	var direct, saved bytes.Buffer
	writeTable(&direct, res)
	if err := writeJSON(&saved, res); err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/run.json"
	if err := os.WriteFile(path, saved.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	var loaded bytes.Buffer
	if err := printSaved(&loaded, path); err != nil {
		t.Fatal(err)
	}
	if loaded.String() != direct.String() {
		t.Errorf("table from the saved run:\n%s\nwant:\n%s", loaded.String(), direct.String())
	}
}
