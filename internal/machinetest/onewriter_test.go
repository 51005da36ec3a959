package machinetest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper()                   {}
func (r *recorder) Errorf(f string, a ...any) { r.errs = append(r.errs, f) }
func (r *recorder) Fatal(a ...any)            { r.TB.Fatal(a...) }

func TestOneWriterFindsEveryOtherWriter(t *testing.T) {
	dir := t.TempDir()
	src := `package p

type state struct{ phase int }
type m struct{ st state }

func (x *m) to(s state) { x.st = s }
func (x *m) sneak()     { x.st.phase++ }
func (x *m) leak() *int { return &x.st.phase }
func (x *m) read() int  { return x.st.phase }
`
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	// A test file may write it.
	if err := os.WriteFile(filepath.Join(dir, "p_test.go"), []byte("package p\n\nfunc set(x *m) { x.st = state{} }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &recorder{TB: t}
	OneWriter(r, dir, "st", "to")
	if len(r.errs) != 2 || !strings.Contains(strings.Join(r.errs, "\n"), "only %s may") {
		t.Errorf("OneWriter found %d problems %q, want the two other writers (sneak, leak)", len(r.errs), r.errs)
	}
	r = &recorder{TB: t}
	OneWriter(r, dir, "st", "read")
	if len(r.errs) != 4 { // to, sneak, leak write it; read writes it 0 times
		t.Errorf("OneWriter with the wrong writer found %d problems, want 4", len(r.errs))
	}
}
