package detachment

import (
	"sync"
	"time"
)

// Reason says why a runner detached.
type Reason int

// Reasons to detach.
const (
	ReasonNone Reason = iota
	// ReasonLeaseDeadline: the lease deadline minus the margin was reached
	// without an acknowledged renewal.
	ReasonLeaseDeadline
	// ReasonKeepAliveStreak: consecutive keep-alive failures reached the
	// threshold.
	ReasonKeepAliveStreak
	// ReasonStorageError: a list, acquire or verify call failed.
	ReasonStorageError
	// ReasonLeaseLost: the store said the lease does not exist.
	ReasonLeaseLost
	// ReasonLockLost: an owned lock was deleted or taken behind our back.
	ReasonLockLost
	// ReasonManual: an operator or program asked for it.
	ReasonManual
)

var reasonNames = [...]string{
	ReasonNone:            "none",
	ReasonLeaseDeadline:   "lease deadline reached",
	ReasonKeepAliveStreak: "keep-alive failure streak",
	ReasonStorageError:    "storage error",
	ReasonLeaseLost:       "lease lost",
	ReasonLockLost:        "owned lock lost",
	ReasonManual:          "manual",
}

// String returns a readable name, e.g. "lease deadline reached".
func (r Reason) String() string {
	if r < 0 || int(r) >= len(reasonNames) {
		return "unknown"
	}
	return reasonNames[r]
}

// Config configures a Machine.
type Config struct {
	// Enabled: detach for real. When false the machine stays attached and
	// Detach reports what it would have done.
	Enabled bool
	// RecoverWindow of continuous health required before re-attaching.
	RecoverWindow time.Duration
	// MaxSignalGap is the longest time between two health signals that
	// still counts as observed health. A healthy signal arriving later than
	// this after the previous signal (a process pause, a probe that hung)
	// starts the recover window over: time nobody observed is not health.
	// Zero: no limit.
	MaxSignalGap time.Duration
}

// State is a snapshot of a Machine.
type State struct {
	Detached bool
	Reason   Reason    // why it detached (the latest reason while detached)
	Detail   string    // free text, e.g. the storage error
	Since    time.Time // when it detached (or re-attached)
	// HealthySince is the start of the current run of healthy signals;
	// zero while unhealthy.
	HealthySince time.Time
}

// Machine is the detach / re-attach state machine.
type Machine struct {
	mu         sync.Mutex
	cfg        Config
	st         State
	lastSignal time.Time // the last health signal, healthy or not
}

// New returns an attached machine.
func New(cfg Config) *Machine { return &Machine{cfg: cfg} }

// Enabled reports whether the machine detaches for real.
func (m *Machine) Enabled() bool { return m.cfg.Enabled }

// State returns the current state.
func (m *Machine) State() State {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st
}

// IsDetached reports whether the machine is detached.
func (m *Machine) IsDetached() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st.Detached
}

// Transitions, under m.mu. Invariants:
//   - Detached implies Reason != ReasonNone; attached implies ReasonNone.
//   - HealthySince is zero right after any detach and after every unhealthy
//     signal, so re-attachment needs RecoverWindow of health that started
//     after the last failure.
//   - Health is only what signals observed: a healthy signal more than
//     MaxSignalGap after the previous signal restarts HealthySince at its
//     own instant (a paused process saw nothing in between).
//   - With Enabled false, Detached stays false.

// Detach trips the machine at now for reason. It reports whether this call
// made the attached -> detached transition; a call while already detached
// only updates the reason and detail. When disabled it changes nothing and
// returns false.
func (m *Machine) Detach(now time.Time, reason Reason, detail string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case !m.cfg.Enabled:
		return false
	case m.st.Detached:
		m.st.Reason, m.st.Detail = reason, detail
		m.st.HealthySince = time.Time{}
		return false
	default:
		m.st = State{Detached: true, Reason: reason, Detail: detail, Since: now}
		return true
	}
}

// SignalHealthy records a successful probe at now. After a gap of more
// than MaxSignalGap since the previous signal, the run of health starts at
// now.
func (m *Machine) SignalHealthy(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	gap := m.cfg.MaxSignalGap > 0 && !m.lastSignal.IsZero() && now.Sub(m.lastSignal) > m.cfg.MaxSignalGap
	if m.st.HealthySince.IsZero() || gap {
		m.st.HealthySince = now
	}
	m.lastSignal = now
}

// SignalUnhealthy records a failed probe: the recover window starts over.
func (m *Machine) SignalUnhealthy(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.st.HealthySince = time.Time{}
	m.lastSignal = now
}

// ReattachAt returns when a detached machine may re-attach if health holds
// (HealthySince + RecoverWindow); ok is false when attached or unhealthy.
func (m *Machine) ReattachAt() (at time.Time, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.st.Detached || m.st.HealthySince.IsZero() {
		return time.Time{}, false
	}
	return m.st.HealthySince.Add(m.cfg.RecoverWindow), true
}

// MaybeReattach re-attaches if the machine is detached and has been healthy
// without interruption for RecoverWindow at now. It reports whether this
// call made the transition.
func (m *Machine) MaybeReattach(now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case !m.st.Detached, m.st.HealthySince.IsZero():
		return false
	case now.Sub(m.st.HealthySince) < m.cfg.RecoverWindow:
		return false
	default:
		m.st = State{Since: now, HealthySince: m.st.HealthySince}
		return true
	}
}

// Policy decides when a runner must detach.
type Policy struct {
	// Margin before the lease deadline at which to detach.
	Margin time.Duration
	// FailureThreshold of consecutive keep-alive failures that detaches;
	// 0 disables this trigger (the deadline still applies).
	FailureThreshold int
}

// TripAt returns the instant a lease with this deadline must be detached:
// deadline - Margin.
func (p Policy) TripAt(deadline time.Time) time.Time { return deadline.Add(-p.Margin) }

// Lease is what the policy needs to know of the lease.
type Lease struct {
	Deadline      time.Time
	FailureStreak int
	Lost          bool
}

// Evaluate returns the reason to detach at now, or ReasonNone. The lease
// being lost comes first, then the deadline, then the streak.
func (p Policy) Evaluate(now time.Time, l Lease) Reason {
	switch {
	case l.Lost:
		return ReasonLeaseLost
	case !now.Before(p.TripAt(l.Deadline)):
		return ReasonLeaseDeadline
	case p.FailureThreshold > 0 && l.FailureStreak >= p.FailureThreshold:
		return ReasonKeepAliveStreak
	default:
		return ReasonNone
	}
}
