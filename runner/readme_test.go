package runner_test

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEQuotesTheExample: the README's "Using it" code is
// example_readme_test.go from its import block on, with Example_cluster
// as func main — so the README's code compiles with the tests.
func TestREADMEQuotesTheExample(t *testing.T) {
	src, err := os.ReadFile("example_readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../docs/guide.md")
	if err != nil {
		t.Fatal(err)
	}
	ex := string(src)
	i := strings.Index(ex, "import (")
	if i < 0 || !strings.Contains(ex, "func Example_cluster() {") {
		t.Fatal("example_readme_test.go: no import block or no Example_cluster")
	}
	want := "```go\n" + strings.Replace(ex[i:], "func Example_cluster() {", "func main() {", 1) + "```\n"
	if !strings.Contains(string(readme), want) {
		t.Errorf("docs/guide.md does not quote example_readme_test.go; its block must be:\n%s", want)
	}
}
