package testenv

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestBinDir(t *testing.T) {
	dir, err := BinDir()
	if err != nil {
		t.Fatalf("BinDir() error = %v", err)
	}
	if filepath.Base(dir) != "bin" {
		t.Errorf("BinDir() = %q, want a directory named bin", dir)
	}
	if got, err := goModPath(filepath.Join(filepath.Dir(dir), "go.mod")); err != nil || got != ModulePath {
		t.Errorf("module of %s = %q, %v; want %q", filepath.Dir(dir), got, err, ModulePath)
	}
	for _, name := range []string{"etcd", "toxiproxy-server"} {
		if p := Binary(t, name); p != filepath.Join(dir, name) {
			t.Errorf("Binary(%q) = %q, want it in %s", name, p, dir)
		}
	}

	other := t.TempDir()
	t.Setenv(BinEnv, other)
	if got, err := BinDir(); err != nil || got != other {
		t.Errorf("with %s=%s: BinDir() = %q, %v; want %q", BinEnv, other, got, err, other)
	}
}

func TestGoModPath(t *testing.T) {
	tests := []struct {
		gomod string
		want  string
	}{
		{"module github.com/shardhost/shardhost\n\ngo 1.26.0\n", ModulePath},
		{"// comment\nmodule \"github.com/shardhost/shardhost\" // quoted\n", ModulePath},
		{"module github.com/shardhost/shardhost/tools\n", ModulePath + "/tools"},
		{"modulex foo\ngo 1.26\n", ""},
	}
	for _, tt := range tests {
		path := filepath.Join(t.TempDir(), "go.mod")
		if err := os.WriteFile(path, []byte(tt.gomod), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := goModPath(path); err != nil || got != tt.want {
			t.Errorf("goModPath(%q) = %q, %v; want %q", tt.gomod, got, err, tt.want)
		}
	}
}

// fatalTB records Fatalf instead of failing the real test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = strings.TrimSpace(sprintf(format, args...))
	runtime.Goexit()
}

func TestBinaryMissingFails(t *testing.T) {
	t.Setenv(BinEnv, t.TempDir())
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Binary(f, "etcd")
	}()
	<-done
	if !strings.Contains(f.msg, "make setup") {
		t.Errorf("Binary(missing) fatal message = %q, want it to mention `make setup`", f.msg)
	}
}

func TestFreePortUnique(t *testing.T) {
	seen := make(map[int]bool)
	for range 200 {
		p := FreePort(t)
		if seen[p] {
			t.Fatalf("FreePort returned %d twice", p)
		}
		seen[p] = true
	}
	if a := FreeAddr(t); !strings.HasPrefix(a, "127.0.0.1:") {
		t.Errorf("FreeAddr() = %q, want 127.0.0.1:port", a)
	}
}
