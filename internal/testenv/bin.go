package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// ModulePath is the module path whose go.mod marks the repository root, the
// directory holding bin/.
const ModulePath = "github.com/shardhost/shardhost"

// BinEnv is the environment variable that, when set, names the directory
// holding the pinned binaries instead of the repository's bin/.
const BinEnv = "SHARDHOST_BIN"

// BinDir returns the absolute path of the directory holding the pinned
// binaries: $SHARDHOST_BIN if set, otherwise bin/ next to the go.mod of
// module [ModulePath], found by walking up from the working directory. The
// directory must exist.
func BinDir() (string, error) {
	if dir := os.Getenv(BinEnv); dir != "" {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return "", fmt.Errorf("testenv: %s=%q: %w", BinEnv, dir, err)
		}
		if err := checkDir(abs); err != nil {
			return "", fmt.Errorf("testenv: %s: %w", BinEnv, err)
		}
		return abs, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, "bin")
	if err := checkDir(dir); err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	return dir, nil
}

func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	return nil
}

// repoRoot walks up from the working directory to the directory whose go.mod
// declares module ModulePath.
func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("testenv: working directory: %w", err)
	}
	for dir := wd; ; {
		path, err := goModPath(filepath.Join(dir, "go.mod"))
		switch {
		case err == nil && path == ModulePath:
			return dir, nil
		case err != nil && !errors.Is(err, os.ErrNotExist):
			return "", fmt.Errorf("testenv: %w", err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("testenv: no go.mod with module %s above %s", ModulePath, wd)
		}
		dir = parent
	}
}

// goModPath returns the module path declared in the go.mod file at path.
func goModPath(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.Index(line, "//"); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		rest, ok := strings.CutPrefix(line, "module")
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '\t') {
			continue
		}
		mod := strings.TrimSpace(rest)
		if unq, err := strconv.Unquote(mod); err == nil {
			mod = unq
		}
		return mod, nil
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return "", nil
}

// Binary returns the absolute path of the executable name in [BinDir]. If the
// directory or the executable is missing, the test fails (it does not skip)
// with a message asking to run `make setup` in the repository root.
func Binary(t testing.TB, name string) string {
	t.Helper()
	path, err := BinaryPath(name)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return path
}

// BinaryPath returns the absolute path of the executable name in [BinDir],
// or, if the directory or the executable is missing, an error saying to run
// `make setup` in the repository root. It is [Binary] for programs that are
// not tests.
func BinaryPath(name string) (string, error) {
	dir, err := BinDir()
	if err != nil {
		return "", fmt.Errorf("testenv: binary %q: %w; run `make setup` in the repository root to build the pinned binaries into bin/", name, err)
	}
	path := filepath.Join(dir, name)
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return "", fmt.Errorf("testenv: binary %q: %w; run `make setup` in the repository root to build the pinned binaries into bin/", name, err)
	case !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0:
		return "", fmt.Errorf("testenv: binary %q: %s is not an executable file; run `make setup` in the repository root", name, path)
	}
	return path, nil
}
