package schedule

import (
	"context"
	"sync"
	"time"
)

// clockBase makes monotonic nanosecond readings: time.Since(clockBase).
var clockBase = time.Now()

// Now returns the scheduler's clock: monotonic nanoseconds since an
// arbitrary origin (the same origin for every Scheduler of the process).
func Now() int64 { return int64(time.Since(clockBase)) }

// At returns the scheduler clock reading of wall time t, assuming the wall
// clock keeps its current offset to the monotonic clock.
func At(t time.Time) int64 { return Now() + int64(time.Until(t)) }

// Firer is the owner of an Entry: Fire is called on the scheduler's
// goroutine when the entry is due (it has left the schedule by then). It
// must not block: it hands work off (a mailbox push) and may schedule the
// entry again. now is the scheduler clock at the call.
type Firer interface {
	Fire(e *Entry, now int64)
}

// Entry is one scheduled item, usually embedded in its owner. An entry is
// in at most one place at a time: the schedule (a heap by due time) or the
// catch-up queue. Its fields are the scheduler's; set F before scheduling.
type Entry struct {
	F   Firer
	due int64  // scheduler clock
	seq uint64 // insertion order among equal due times
	pos int32  // heap index + 1, or -(catch-up position + 1); 0: not scheduled
}

// Due returns the entry's due time (scheduler clock) as last scheduled.
func (e *Entry) Due() int64 { return e.due }

// Config holds a Scheduler's settings.
type Config struct {
	// CatchUpRate bounds the entries fired from the catch-up queue, per
	// second (0: no bound). CatchUpBurst is how many may fire at once
	// (default: CatchUpRate/10, at least 1).
	CatchUpRate  float64
	CatchUpBurst int
	// Lag, if set, is called for every entry fired from the schedule with
	// how late it fired (the scheduler clock at the fire minus its due
	// time), outside the scheduler's lock.
	Lag func(d time.Duration)
}

// Scheduler fires entries at their due time from one goroutine (Run): a
// binary heap ordered by due time, plus a FIFO catch-up queue drained at a
// bounded rate. Schedule, Stop and CatchUp are safe for concurrent use and
// may be called from a Firer. Entries fire in due-time order (insertion
// order among equal times); an entry that is rescheduled or stopped before
// it was popped does not fire for the old time.
type Scheduler struct {
	cfg  Config
	kick chan struct{} // 1-buffered: the earliest due time moved earlier

	mu     sync.Mutex
	heap   []*Entry
	catch  []*Entry // FIFO; nil slots are stopped entries
	head   int      // first live index of catch
	seq    uint64
	tokens float64
	refill int64 // scheduler clock of the last token refill
}

// New returns a Scheduler; Run fires its entries.
func New(cfg Config) *Scheduler {
	if cfg.CatchUpRate > 0 && cfg.CatchUpBurst <= 0 {
		cfg.CatchUpBurst = max(1, int(cfg.CatchUpRate/10))
	}
	return &Scheduler{cfg: cfg, kick: make(chan struct{}, 1), tokens: float64(cfg.CatchUpBurst), refill: Now()}
}

// batchSize bounds the entries popped under the lock at once.
const batchSize = 256

// Run fires due entries until ctx ends. Entries left in the schedule stay
// there (a later Run fires them).
func (s *Scheduler) Run(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	batch := make([]*Entry, 0, batchSize)
	var lags []int64
	for {
		now := Now()
		var wait int64
		batch, lags, wait = s.pop(now, batch[:0], lags[:0])
		for i, e := range batch {
			if s.cfg.Lag != nil && lags[i] >= 0 {
				s.cfg.Lag(time.Duration(lags[i]))
			}
			e.F.Fire(e, now)
			batch[i] = nil
		}
		if len(batch) > 0 {
			continue // more may be due
		}
		t.Reset(time.Duration(max(wait, int64(time.Microsecond))))
		select {
		case <-ctx.Done():
			return
		case <-s.kick: // the next Reset drops a tick not received (Go 1.23 timers)
		case <-t.C:
		}
	}
}

// pop removes up to batchSize entries due at now (catch-up ones within
// the rate) into batch, with their lateness in lags (-1 for catch-up
// entries), and returns how long to wait when none is due.
func (s *Scheduler) pop(now int64, batch []*Entry, lags []int64) ([]*Entry, []int64, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(batch) < batchSize && len(s.heap) > 0 && s.heap[0].due <= now {
		e := s.heap[0]
		s.removeAt(0)
		batch = append(batch, e)
		lags = append(lags, now-e.due)
	}
	wait := int64(time.Hour)
	if len(s.heap) > 0 {
		wait = s.heap[0].due - now
	}
	if s.head == len(s.catch) {
		return batch, lags, wait
	}
	if s.cfg.CatchUpRate > 0 {
		s.tokens = min(float64(s.cfg.CatchUpBurst), s.tokens+float64(now-s.refill)*s.cfg.CatchUpRate/1e9)
		s.refill = now
	}
	for len(batch) < batchSize && s.head < len(s.catch) && (s.cfg.CatchUpRate <= 0 || s.tokens >= 1) {
		e := s.catch[s.head]
		s.catch[s.head] = nil
		s.head++
		if e == nil {
			continue
		}
		e.pos = 0
		batch = append(batch, e)
		lags = append(lags, -1)
		s.tokens--
	}
	if s.head == len(s.catch) {
		s.catch, s.head = s.catch[:0], 0
	} else if s.head > 1024 && s.head > len(s.catch)/2 {
		n := copy(s.catch, s.catch[s.head:])
		for i := n; i < len(s.catch); i++ {
			s.catch[i] = nil
		}
		for i, e := range s.catch[:n] {
			if e != nil {
				e.pos = -int32(i + 1)
			}
		}
		s.catch, s.head = s.catch[:n], 0
	}
	if s.head < len(s.catch) && len(batch) < batchSize {
		// Rate-limited: wake when the next token is there.
		wait = min(wait, int64((1-s.tokens)*1e9/s.cfg.CatchUpRate)+1)
	} else if s.head < len(s.catch) {
		wait = 0
	}
	return batch, lags, wait
}

// Schedule (re)schedules e to fire at due (scheduler clock), taking it out
// of the catch-up queue if it was there.
func (s *Scheduler) Schedule(e *Entry, due int64) {
	s.mu.Lock()
	s.unlinkLocked(e)
	s.seq++
	e.due, e.seq = due, s.seq
	s.heap = append(s.heap, e)
	e.pos = int32(len(s.heap))
	s.up(len(s.heap) - 1)
	first := s.heap[0] == e
	s.mu.Unlock()
	if first {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// CatchUp queues e to fire as soon as the catch-up rate allows, behind the
// entries already queued, taking it out of the schedule if it was there.
func (s *Scheduler) CatchUp(e *Entry) {
	s.mu.Lock()
	s.unlinkLocked(e)
	s.catch = append(s.catch, e)
	e.pos = -int32(len(s.catch))
	first := s.head == len(s.catch)-1
	s.mu.Unlock()
	if first {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// Stop takes e out of the schedule or the catch-up queue and reports
// whether it was in either. An entry being fired is in neither.
func (s *Scheduler) Stop(e *Entry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unlinkLocked(e)
}

// Scheduled reports whether e waits in the schedule or the catch-up queue.
func (s *Scheduler) Scheduled(e *Entry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return e.pos != 0
}

// Len returns the entries in the schedule and in the catch-up queue.
func (s *Scheduler) Len() (scheduled, catchUp int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, e := range s.catch[s.head:] {
		if e != nil {
			n++
		}
	}
	return len(s.heap), n
}

func (s *Scheduler) unlinkLocked(e *Entry) bool {
	switch {
	case e.pos > 0:
		s.removeAt(int(e.pos - 1))
		return true
	case e.pos < 0:
		s.catch[int(-e.pos-1)] = nil
		e.pos = 0
		return true
	}
	return false
}

func (s *Scheduler) less(i, j int) bool {
	a, b := s.heap[i], s.heap[j]
	return a.due < b.due || (a.due == b.due && a.seq < b.seq)
}

func (s *Scheduler) swap(i, j int) {
	h := s.heap
	h[i], h[j] = h[j], h[i]
	h[i].pos, h[j].pos = int32(i+1), int32(j+1)
}

func (s *Scheduler) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *Scheduler) down(i int) {
	n := len(s.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && s.less(r, l) {
			m = r
		}
		if !s.less(m, i) {
			return
		}
		s.swap(i, m)
		i = m
	}
}

// removeAt removes the heap element at index i.
func (s *Scheduler) removeAt(i int) {
	last := len(s.heap) - 1
	e := s.heap[i]
	if i != last {
		s.swap(i, last)
	}
	s.heap[last] = nil
	s.heap = s.heap[:last]
	e.pos = 0
	if i < last {
		s.down(i)
		s.up(i)
	}
}
