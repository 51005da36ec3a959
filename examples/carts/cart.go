package main

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
)

// Cart is a shopping cart that expires after idle without an item added:
// every Add re-registers its "expire" reminder one idle period ahead (a
// durable one-shot reminder: it fires on whichever runner owns the cart's
// shard then, even if the cart is not resident, and after a crash), and a
// checkout cancels it. An in-memory timer nudges the shopper once after a
// shorter pause (a timer ends with the cart's instance: nothing to clean
// up). State survives moves through the Release and Activate hooks.
type Cart struct {
	id    string
	Items map[string]int `json:"items"`
	// Expired and CheckedOut keep the cart's outcome, so a reminder
	// fired twice after a crash (Redelivered) is applied once.
	Expired    bool `json:"expired"`
	CheckedOut bool `json:"checkedOut"`
}

// AddReq adds one item to a cart.
type AddReq struct {
	SKU string
}

// AddResp is the cart's size after an Add, and when it will expire.
type AddResp struct {
	Items     int
	ExpiresAt time.Time
}

// CheckoutReq checks a cart out.
type CheckoutReq struct{}

// Timing of the carts, short for the demo (production: 30 minutes, 5
// minutes, nightly).
var (
	idle          = 3 * time.Second // a cart expires this long after its last Add
	nudgeAfter    = time.Second     // the in-memory nudge timer
	summaryPeriod = 2 * time.Second // the summary's periodic reminder
	summaryFirst  = func() time.Time { return time.Now().Add(summaryPeriod) }
)

// Kinds and handlers, defined once at package level and registered on
// every runner (the gateway too: it routes them).
var (
	CartKind = entity.NewKind("cart", func(id string) *Cart { return &Cart{id: id} })
	Add      = entity.Method(CartKind, "add", (*Cart).Add)
	Checkout = entity.Method(CartKind, "checkout", (*Cart).Checkout)
	Expire   = entity.Reminder(CartKind, "expire", (*Cart).Expire)
	Nudge    = entity.Timer(CartKind, "nudge", (*Cart).Nudge)

	SummaryKind = entity.NewKind("summary", func(id string) *Summary { return &Summary{id: id} })
	Report      = entity.Signal(SummaryKind, "report", (*Summary).Report)
	Arm         = entity.Method(SummaryKind, "arm", (*Summary).Arm, entity.Idempotent())
	Nightly     = entity.Reminder(SummaryKind, "nightly", (*Summary).Nightly)
)

// Add adds an item and pushes the cart's expiry one idle period ahead.
func (c *Cart) Add(ctx context.Context, r AddReq) (AddResp, error) {
	if c.Items == nil {
		c.Items = map[string]int{}
	}
	c.Items[r.SKU]++
	c.Expired, c.CheckedOut = false, false
	at := time.Now().Add(idle)
	if err := Expire.Register(ctx, "expire", entity.Schedule{First: at}, len(c.Items)); err != nil {
		return AddResp{}, err
	}
	if err := Nudge.After(ctx, "nudge", nudgeAfter, "still shopping?"); err != nil {
		return AddResp{}, err
	}
	record(ctx, c.id, "add", at, false)
	return AddResp{Items: len(c.Items), ExpiresAt: at}, nil
}

// Checkout empties the cart and cancels its expiry.
func (c *Cart) Checkout(ctx context.Context, _ CheckoutReq) (int, error) {
	n := len(c.Items)
	if err := Expire.Cancel(ctx, "expire"); err != nil {
		return 0, err
	}
	_, _ = entity.StopTimer(ctx, "nudge")
	c.Items, c.CheckedOut = nil, true
	record(ctx, c.id, "checkout", time.Time{}, false)
	if sender, ok := runner.SenderFrom(ctx); ok {
		_ = Report.Tell(ctx, sender, "today", Outcome{CheckedOut: 1})
	}
	return n, nil
}

// Expire is the cart's reminder: it empties an abandoned cart (once, even
// if the reminder is redelivered after a crash).
func (c *Cart) Expire(ctx context.Context, t entity.ReminderTick[int]) error {
	if c.Expired || c.CheckedOut {
		record(ctx, c.id, "expire-duplicate", t.Due, t.Redelivered)
		return nil
	}
	c.Items, c.Expired = nil, true
	record(ctx, c.id, "expire", t.Due, t.Redelivered)
	if sender, ok := runner.SenderFrom(ctx); ok {
		_ = Report.Tell(ctx, sender, "today", Outcome{Expired: 1})
	}
	return nil
}

// Nudge is the cart's in-memory timer.
func (c *Cart) Nudge(ctx context.Context, t entity.TimerTick[string]) error {
	record(ctx, c.id, "nudge", time.Time{}, false)
	return nil
}

// Activate restores the cart from its checkpoint.
func (c *Cart) Activate(ctx context.Context, info entity.ActivateInfo) error {
	if info.Restore == nil {
		return nil
	}
	data, ok, err := info.Restore(ctx)
	if err != nil || !ok {
		return err
	}
	return json.Unmarshal(data, c)
}

// Release checkpoints the cart, or deletes its checkpoint once it ended.
func (c *Cart) Release(ctx context.Context, info entity.ReleaseInfo) error {
	if info.Checkpoint == nil {
		return nil
	}
	if len(c.Items) == 0 && !c.Expired && !c.CheckedOut {
		return info.DeleteCheckpoint(ctx)
	}
	data, _ := json.Marshal(c)
	return info.Checkpoint(ctx, data)
}

// Outcome is what a cart reports to the summary.
type Outcome struct {
	Expired, CheckedOut int
}

// Summary counts the carts' outcomes and reports them on a periodic
// reminder (nightly in production; every summaryPeriod here). It
// checkpoints its counts on every report (fenced), so they survive moves
// and crashes.
type Summary struct {
	id         string
	Expired    int `json:"expired"`
	CheckedOut int `json:"checkedOut"`
	save       func(context.Context, []byte) error
}

// Activate restores the counts and keeps the fenced checkpoint writer.
func (s *Summary) Activate(ctx context.Context, info entity.ActivateInfo) error {
	s.save = info.Checkpoint
	if info.Restore == nil {
		return nil
	}
	data, ok, err := info.Restore(ctx)
	if err != nil || !ok {
		return err
	}
	return json.Unmarshal(data, s)
}

func (s *Summary) persist(ctx context.Context) error {
	if s.save == nil {
		return nil
	}
	data, _ := json.Marshal(s)
	return s.save(ctx, data)
}

// Report adds a cart's outcome.
func (s *Summary) Report(ctx context.Context, o Outcome) error {
	s.Expired += o.Expired
	s.CheckedOut += o.CheckedOut
	return s.persist(ctx)
}

// Arm registers the summary's periodic reminder (idempotent: the same
// name is replaced).
func (s *Summary) Arm(ctx context.Context, _ struct{}) (bool, error) {
	return true, Nightly.Register(ctx, "nightly", entity.Schedule{First: summaryFirst(), Period: summaryPeriod}, "")
}

// Nightly reports the outcomes since the previous report.
func (s *Summary) Nightly(ctx context.Context, t entity.ReminderTick[string]) error {
	info, _ := runner.ShardInfoFrom(ctx)
	journal.mu.Lock()
	journal.summaries = append(journal.summaries, summaryLine{Tick: t.Tick, Missed: t.Missed, Redelivered: t.Redelivered,
		Expired: s.Expired, CheckedOut: s.CheckedOut, Runner: info.Runner, At: time.Now()})
	journal.mu.Unlock()
	s.Expired, s.CheckedOut = 0, 0
	return s.persist(ctx)
}

// The demo's record of what happened, read by its checks.
var journal = &eventLog{}

type cartEvent struct {
	What        string
	Due         time.Time // add: when it should expire; expire: the tick's due time
	Redelivered bool
	Runner      string
	At          time.Time
}

type summaryLine struct {
	Tick, Missed        uint64
	Redelivered         bool
	Expired, CheckedOut int
	Runner              string
	At                  time.Time
}

type eventLog struct {
	mu        sync.Mutex
	events    map[string][]cartEvent // by cart
	summaries []summaryLine
	nudges    int
}

func record(ctx context.Context, cart, what string, due time.Time, redelivered bool) {
	info, _ := runner.ShardInfoFrom(ctx)
	journal.mu.Lock()
	defer journal.mu.Unlock()
	if journal.events == nil {
		journal.events = map[string][]cartEvent{}
	}
	if what == "nudge" {
		journal.nudges++
		return
	}
	ev := cartEvent{What: what, Due: due, Redelivered: redelivered, Runner: info.Runner, At: time.Now()}
	journal.events[cart] = append(journal.events[cart], ev)
}
