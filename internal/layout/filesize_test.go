package layout

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// maxLibraryFileLines bounds a library source file: past it a file holds
// more than one subject, and a reader looking for one finds the others.
const maxLibraryFileLines = 600

// TestLibraryFilesStayUnderTheLineBound reads every non-test Go file of the
// library's packages (all but cmd/, the programs, and the test helpers and
// harnesses of isTestCode) and fails for each one longer than
// maxLibraryFileLines, naming it and its length.
func TestLibraryFilesStayUnderTheLineBound(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{.Dir}} {{join .GoFiles \" \"}}", module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	files := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		pkg := strings.TrimPrefix(f[0], module)
		if isTestCode(pkg) || strings.HasPrefix(pkg, "cmd/") || len(f) < 3 {
			continue
		}
		for _, name := range f[2:] {
			b, err := os.ReadFile(filepath.Join(f[1], name))
			if err != nil {
				t.Fatal(err)
			}
			files++
			if n := bytes.Count(b, []byte("\n")); n > maxLibraryFileLines {
				t.Errorf("%s/%s has %d lines (at most %d): split it by subject", pkg, name, n, maxLibraryFileLines)
			}
		}
	}
	if files < 100 {
		t.Fatalf("read %d library files; want the whole library", files)
	}
}
