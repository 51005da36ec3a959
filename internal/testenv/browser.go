package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ChromiumEnv is the environment variable that, when set, names the
// Chromium (or Chrome) executable the browser tests use instead of the one
// found on PATH.
const ChromiumEnv = "SHARDHOST_CHROMIUM"

// chromiumNames are the executables looked up on PATH, in order. Debian's
// package `chromium` installs /usr/bin/chromium (`make setup` installs it
// when it can).
var chromiumNames = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}

// browserTimeout bounds one run of the browser.
const browserTimeout = 90 * time.Second

// ChromiumPath returns the path of a Chromium executable: $SHARDHOST_CHROMIUM
// if set, otherwise the first of chromium, chromium-browser, google-chrome
// found on PATH. The error says how to install it.
func ChromiumPath() (string, error) {
	if p := os.Getenv(ChromiumEnv); p != "" {
		path, err := exec.LookPath(p)
		if err != nil {
			return "", fmt.Errorf("testenv: %s=%q: %w", ChromiumEnv, p, err)
		}
		return path, nil
	}
	for _, name := range chromiumNames {
		if path, err := exec.LookPath(name); err == nil {
			return path, nil
		}
	}
	return "", errors.New("testenv: no Chromium on PATH (looked for " + strings.Join(chromiumNames, ", ") +
		"); `make setup` installs Debian's package chromium when apt-get can, or install it by hand, or set " + ChromiumEnv)
}

// Browser is a headless Chromium for tests: each call runs one browser
// process on a fresh profile, bounded in time, with no network access
// beyond the pages it is given (background networking, component updates,
// sync and QUIC are off).
type Browser struct {
	path string
	t    testing.TB
}

// Chromium returns a headless browser, or skips the test (with the reason
// and how to install it) when no Chromium is installed. Unlike etcd, the
// browser is optional: the tests that use it are checks of what a person
// sees, and CI runs them wherever `make setup` could install it.
func Chromium(t testing.TB) *Browser {
	t.Helper()
	SkipIfShort(t, "starts Chromium")
	path, err := ChromiumPath()
	if err != nil {
		t.Skipf("skipping the browser check: %v", err)
	}
	return &Browser{path: path, t: t}
}

// TryChromium returns a headless browser, or nil (logging why) when no
// Chromium is installed: for tests whose browser checks are only a part.
func TryChromium(t testing.TB) *Browser {
	t.Helper()
	path, err := ChromiumPath()
	if err != nil {
		t.Logf("skipping the browser checks: %v", err)
		return nil
	}
	return &Browser{path: path, t: t}
}

// Load opens url, lets the page run for budget of virtual time (Chromium
// fast-forwards timers and waits for pending fetches, so a page that
// refreshes itself every 2 s refreshes twice in a 5 s budget without
// taking 5 s), and returns the serialized DOM.
func (b *Browser) Load(url string, budget time.Duration) string {
	b.t.Helper()
	out := b.run(budget, "--dump-dom", url)
	if !strings.Contains(out, "<html") {
		b.t.Fatalf("chromium --dump-dom %s printed no document:\n%s", url, tail(out))
	}
	return out
}

// Screenshot loads url in a window of width x height pixels, lets the page
// run for budget of virtual time, and writes a PNG of the window to path.
func (b *Browser) Screenshot(url, path string, width, height int, budget time.Duration) {
	b.t.Helper()
	abs, err := filepath.Abs(path)
	if err != nil {
		b.t.Fatal(err)
	}
	_ = os.Remove(abs)
	out := b.run(budget, "--screenshot="+abs, "--window-size="+strconv.Itoa(width)+","+strconv.Itoa(height), "--hide-scrollbars", url)
	fi, err := os.Stat(abs)
	if err != nil || fi.Size() == 0 {
		b.t.Fatalf("chromium --screenshot %s wrote no picture (%v):\n%s", url, err, tail(out))
	}
}

// run runs the browser with the common flags and args; it returns stdout
// and fails the test (with stderr's tail) when the browser fails.
func (b *Browser) run(budget time.Duration, args ...string) string {
	b.t.Helper()
	profile := b.t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), browserTimeout)
	defer cancel()
	flags := []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
		"--no-first-run", "--no-default-browser-check", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--disable-extensions", "--mute-audio",
		"--user-data-dir=" + profile,
		"--virtual-time-budget=" + strconv.FormatInt(budget.Milliseconds(), 10),
	}
	cmd := exec.CommandContext(ctx, b.path, append(flags, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = browserProcAttr()
	cmd.Cancel = func() error { return killBrowser(cmd) }
	cmd.WaitDelay = 5 * time.Second
	// The browser's own D-Bus and crash-reporter lookups fail here; keep
	// it away from any session bus of the machine.
	cmd.Env = append(os.Environ(), "DBUS_SESSION_BUS_ADDRESS=disabled:")
	err := cmd.Run()
	if err != nil {
		b.t.Fatalf("chromium %s: %v (timeout %v)\nstderr:\n%s", strings.Join(args, " "), err, browserTimeout, tail(stderr.String()))
	}
	return stdout.String()
}

func tail(s string) string {
	const n = 4 << 10
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
