package runner

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// durations lists the duration fields that must be positive (after
// defaults), by name, in declaration order. AcquireRetryWindow is not among
// them: negative means SingleAttempt.
func (c Config) durations() []namedValue[time.Duration] {
	return []namedValue[time.Duration]{
		{"RequestTimeout", c.RequestTimeout}, {"ConnectTimeout", c.ConnectTimeout},
		{"LeaseTTL", c.LeaseTTL}, {"LeaseRenewInterval", c.LeaseRenewInterval},
		{"KeepAliveRetryInterval", c.KeepAliveRetryInterval}, {"DetachMargin", c.DetachMargin},
		{"RecoverWindow", c.RecoverWindow}, {"ProbeInterval", c.ProbeInterval},
		{"AcquireRetryInterval", c.AcquireRetryInterval}, {"RebalanceDebounce", c.RebalanceDebounce},
		{"ResyncInterval", c.ResyncInterval}, {"VerifyInterval", c.VerifyInterval},
		{"OpTimeout", c.OpTimeout}, {"DrainTimeout", c.DrainTimeout},
		{"WarmTimeout", c.WarmTimeout}, {"HandoffWait", c.HandoffWait},
		{"ShutdownHandoffTimeout", c.ShutdownHandoffTimeout}, {"PassivationInterval", c.PassivationInterval},
	}
}

// counts lists the integer fields that must not be negative, by name.
func (c Config) counts() []namedValue[int] {
	return []namedValue[int]{
		{"MaxMessageSize", c.MaxMessageSize}, {"MaxWaitingSends", c.MaxWaitingSends}, {"MaxAsyncSends", c.MaxAsyncSends},
		{"MaxConnections", c.MaxConnections}, {"Weight", c.Weight}, {"NumShards", c.NumShards},
		{"KeepAliveFailureThreshold", c.KeepAliveFailureThreshold}, {"StorageErrorThreshold", c.StorageErrorThreshold},
		{"HotSetLimit", c.HotSetLimit}, {"CutoverWaiters", c.CutoverWaiters},
		{"MaxResidentEntities", c.MaxResidentEntities}, {"ReminderCatchUpRate", c.ReminderCatchUpRate},
		{"MaxRemindersPerShard", c.MaxRemindersPerShard}, {"RememberedStartRate", c.RememberedStartRate},
		{"RememberedWarnAt", c.RememberedWarnAt},
	}
}

type namedValue[T any] struct {
	name  string
	value T
}

// checkSet rejects negative values the user set, before defaults are
// derived from them (a negative LeaseTTL must be reported as LeaseTTL, not
// as the renew interval computed from it).
func (c Config) checkSet() error {
	for _, d := range c.durations() {
		if d.value < 0 {
			return fmt.Errorf("%w: %s must not be negative, got %v", ErrInvalidConfig, d.name, d.value)
		}
	}
	for _, n := range c.counts() {
		if n.value < 0 {
			return fmt.Errorf("%w: %s must not be negative, got %d", ErrInvalidConfig, n.name, n.value)
		}
	}
	return nil
}

// validate checks a config with defaults applied.
func (c Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if c.ID == "" {
		return bad("empty ID and no host name")
	}
	if err := storage.ValidateRunnerID(c.ID); err != nil {
		return bad("ID: %v", err)
	}
	if err := sharding.ValidateNumShards(c.NumShards); err != nil {
		return fmt.Errorf("%w: NumShards: %w", ErrInvalidConfig, err)
	}
	if err := validateDebugURL(c.DebugURL); err != nil {
		return err
	}
	for _, d := range c.durations() {
		if d.value <= 0 {
			return bad("%s must be positive, got %v", d.name, d.value)
		}
	}
	switch {
	case c.Weight < 0 || c.Weight > sharding.MaxWeight:
		return bad("Weight %d outside [0, %d]", c.Weight, sharding.MaxWeight)
	case c.LeaseTTL < time.Second:
		return bad("LeaseTTL %v below 1s (etcd grants whole seconds)", c.LeaseTTL)
	case c.DetachMargin >= c.LeaseTTL:
		return bad("DetachMargin %v must be less than LeaseTTL %v", c.DetachMargin, c.LeaseTTL)
	case c.LeaseRenewInterval > c.LeaseTTL/3:
		return bad("LeaseRenewInterval %v must be at most LeaseTTL/3 (%v)", c.LeaseRenewInterval, c.LeaseTTL/3)
	case c.LeaseRenewInterval >= c.LeaseTTL-c.DetachMargin:
		return bad("LeaseRenewInterval %v leaves no time to retry before the detach instant (TTL %v - margin %v)",
			c.LeaseRenewInterval, c.LeaseTTL, c.DetachMargin)
	case c.KeepAliveRetryInterval >= c.LeaseRenewInterval:
		return bad("KeepAliveRetryInterval %v must be less than LeaseRenewInterval %v", c.KeepAliveRetryInterval, c.LeaseRenewInterval)
	case c.KeepAliveFailureThreshold < 0 || c.StorageErrorThreshold < 0:
		return bad("negative failure threshold")
	case c.MaxResidentEntities < 0:
		return bad("negative MaxResidentEntities")
	case c.MaxRemindersPerShard > storage.MaxProgressFired:
		return bad("MaxRemindersPerShard %d above %d (a shard's reminder progress must fit one record)", c.MaxRemindersPerShard, storage.MaxProgressFired)
	case c.MaxMessageSize < 0 || c.MaxWaitingSends < 0 || c.HotSetLimit < 0 || c.CutoverWaiters < 0 || c.MaxConnections < 0:
		return bad("negative MaxMessageSize, MaxWaitingSends, HotSetLimit, CutoverWaiters or MaxConnections")
	}
	if err := c.validateTransportSecurity(); err != nil {
		return err
	}
	return c.validatePeerCheck()
}

// validateTransportSecurity refuses a default transport that would listen
// beyond loopback without TLS, unless AllowInsecureTransport says so.
func (c Config) validateTransportSecurity() error {
	if c.Transport != nil || c.ClientOnly || c.ListenAddr == "" || c.TLS != nil || c.AllowInsecureTransport || loopbackAddr(c.ListenAddr) {
		return nil
	}
	return &InsecureTransportError{ListenAddr: c.ListenAddr}
}

// loopbackAddr reports whether the host of addr ("host:port") is a
// loopback address or "localhost". An address that does not split is
// left to the listener to refuse.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return true
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// validateDebugURL checks Config.DebugURL: the record rule
// (storage.ValidateDebugURL), and no credentials in it — the URL is
// published in the store and shown on every debug page.
func validateDebugURL(u string) error {
	if u == "" {
		return nil
	}
	if err := storage.ValidateDebugURL(u); err != nil {
		return fmt.Errorf("%w: DebugURL: %w", ErrInvalidConfig, err)
	}
	if p, _ := url.Parse(u); p != nil && p.User != nil {
		return fmt.Errorf("%w: DebugURL %q carries credentials (user:password@): it is published in the runner record and shown on "+
			"every debug page; publish it without them, protect the pages with your middleware, and give the pages that fetch it "+
			"the credentials in DebugConfig.HTTPClient, with DebugConfig.PeerURL (see SECURITY.md)", ErrInvalidConfig, p.Redacted())
	}
	return nil
}

// validatePeerCheck checks RequireClusterPeers against the TLS settings.
func (c Config) validatePeerCheck() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case !c.RequireClusterPeers && len(c.ClientPeerNames) > 0:
		return bad("ClientPeerNames without RequireClusterPeers")
	case !c.RequireClusterPeers:
		return nil
	case c.Transport != nil:
		return bad("RequireClusterPeers applies to the default gRPC transport, not to Config.Transport")
	case c.PeerTLS == nil:
		return bad("RequireClusterPeers needs PeerTLS (mutual TLS)")
	case !c.ClientOnly && c.ListenAddr != "" && (c.TLS == nil || c.TLS.ClientAuth != tls.RequireAndVerifyClientCert):
		return bad("RequireClusterPeers needs TLS with ClientAuth tls.RequireAndVerifyClientCert")
	}
	return nil
}

func newIncarnation() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return time.Now().UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b[:])
}
