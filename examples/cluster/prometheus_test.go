//go:build linux

package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/doctable"
	"github.com/shardhost/shardhost/internal/testenv"
)

// promName is the name of the metric family a Prometheus exporter of
// OpenTelemetry gives an instrument documented as name, kind, unit
// (docs/observability.md, "Prometheus"): dots become underscores; a unit
// in braces (an annotation: {shard}) adds nothing, s adds _seconds; a
// counter ends in _total.
func promName(name string, in doctable.Instrument) (family, typ string) {
	family = strings.ReplaceAll(name, ".", "_")
	if in.Unit == "s" {
		family += "_seconds"
	}
	switch in.Kind {
	case "counter":
		return family + "_total", "counter"
	case "histogram":
		return family, "histogram"
	}
	return family, "gauge"
}

// scrape returns the metric families of a Prometheus text exposition:
// name -> type.
func scrape(t *testing.T, url string) (map[string]string, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v", url, resp.Status, err)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("GET %s: Content-Type %q, want Prometheus's text format", url, ct)
	}
	families := map[string]string{}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			families[f[2]] = f[3]
		}
	}
	return families, string(b)
}

// TestPrometheusEndpointServesEveryDocumentedMetric runs a runner and a
// gateway sending traffic (examples/cluster on a real etcd), registers
// reminders through the gateway's API, lets a second runner join (shards
// move by handoff) and scrapes the first runner's MetricsPath on its
// -debug address: every instrument of
// docs/observability.md's table is there, under the name and type the
// documented translation gives, and its samples carry the runner's ID.
func TestPrometheusEndpointServesEveryDocumentedMetric(t *testing.T) {
	doc, err := os.ReadFile("../../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	documented, err := doctable.Parse(string(doc), doctable.ObservabilityRow)
	if err != nil || len(documented) < 20 {
		t.Fatalf("docs/observability.md: %d metrics (%v)", len(documented), err)
	}
	etcd := testenv.StartEtcd(t)
	bin := goBuild(t, "cluster", ".")
	dir := t.TempDir()
	debug, gwDebug := testenv.FreeAddr(t), testenv.FreeAddr(t)
	common := []string{"-etcd", etcd.Endpoint(), "-namespace", "prom", "-shards", "64"}
	start(t, dir, bin, "runner-1", append([]string{"-role", "runner", "-id", "runner-1", "-debug", debug}, common...)...)
	api := testenv.FreeAddr(t)
	start(t, dir, bin, "gateway", append([]string{"-role", "gateway", "-debug", gwDebug, "-api", api, "-rate", "200", "-report", "1h"}, common...)...)
	waitReady(t, http.DefaultClient, "http://"+debug+ReadinessPath, time.Minute, "runner-1")
	waitReady(t, http.DefaultClient, "http://"+gwDebug+ReadinessPath, time.Minute, "gateway")
	// A few reminders, fired by runner-1 alone (the reminder histogram's
	// first observations).
	for i := range 8 {
		resp, err := http.Post(fmt.Sprintf("http://%s/counters/r-%d/remind", api, i), "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s: %s %s", RemindPath, resp.Status, b)
		}
	}
	// A second runner joins: runner-1 hands it shards (the handoff
	// histogram's first observations).
	debug2 := testenv.FreeAddr(t)
	start(t, dir, bin, "runner-2", append([]string{"-role", "runner", "-id", "runner-2", "-debug", debug2}, common...)...)
	waitReady(t, http.DefaultClient, "http://"+debug2+ReadinessPath, time.Minute, "runner-2")

	var families map[string]string
	var text string
	var missing []string
	for p := testenv.NewPatience(30 * time.Second); ; p.Sleep(500 * time.Millisecond) {
		families, text = scrape(t, "http://"+debug+MetricsPath)
		missing = missing[:0]
		for name, in := range documented {
			if fam, typ := promName(name, in); families[fam] != typ {
				missing = append(missing, fmt.Sprintf("%s as %s %s (found: %q)", name, typ, fam, families[fam]))
			}
		}
		if len(missing) == 0 || p.Over() {
			break
		}
	}
	slices.Sort(missing)
	for _, m := range missing {
		t.Errorf("%s: documented metric %s", MetricsPath, m)
	}
	if !strings.Contains(text, `sharding_shards_owned{`) || !strings.Contains(text, `runner="runner-1"`) {
		t.Errorf("%s: no sharding_shards_owned sample labelled runner=\"runner-1\"", MetricsPath)
	}
	if t.Failed() {
		t.Logf("families: %v", families)
	}
}
