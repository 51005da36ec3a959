package debugpage

import (
	"slices"
	"testing"
)

// TestRunnerColors: colours are distinct within the palette, and a
// runner keeps its colour when another one leaves.
func TestRunnerColors(t *testing.T) {
	ids := []string{"runner-1", "runner-2", "runner-3", "a", "b", "c", "d", "e", "f", "g", "h", "i"}
	colors := runnerColors(ids)
	seen := map[string]string{}
	for i, c := range colors {
		if other, dup := seen[c]; dup {
			t.Errorf("%s and %s share colour %s", other, ids[i], c)
		}
		seen[c] = ids[i]
	}
	three := runnerColors(ids[:3])
	without2 := runnerColors([]string{"runner-1", "runner-3"})
	if without2[0] != three[0] || without2[1] != three[2] {
		t.Errorf("colours of runner-1, runner-3: %v with runner-2, %v without", []string{three[0], three[2]}, without2)
	}
	if more := runnerColors(append(ids, "j")); more[12] == "" || slices.Contains(palette, more[12]) {
		t.Errorf("13th runner got %q, want a hue outside the palette", more[12])
	}
}
