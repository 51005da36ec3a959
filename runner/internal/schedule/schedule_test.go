package schedule

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder records the order and time entries fire in.
type recorder struct {
	mu    sync.Mutex
	fired []string
	at    []int64
}

type named struct {
	Entry
	name string
	r    *recorder
	then func(n *named, now int64) // optional, after recording
}

func (n *named) Fire(_ *Entry, now int64) {
	n.r.mu.Lock()
	n.r.fired = append(n.r.fired, n.name)
	n.r.at = append(n.r.at, now)
	n.r.mu.Unlock()
	if n.then != nil {
		n.then(n, now)
	}
}

func (r *recorder) names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.fired)
}

func newNamed(r *recorder, name string) *named {
	n := &named{name: name, r: r}
	n.F = n
	return n
}

func runScheduler(t *testing.T, s *Scheduler) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	return func() { cancel(); <-done }
}

// TestEntriesFireInDueOrderNeverEarly: entries scheduled out of order fire
// in due order, each at or after its due time; equal due times keep their
// insertion order.
func TestEntriesFireInDueOrderNeverEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{})
		stop := runScheduler(t, s)
		defer stop()
		r := &recorder{}
		base := Now()
		dues := map[string]int64{"c": 30, "a": 10, "b": 20, "b2": 20, "d": 40}
		for _, name := range []string{"c", "a", "b", "b2", "d"} {
			s.Schedule(&newNamed(r, name).Entry, base+dues[name]*int64(time.Millisecond))
		}
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		if got, want := r.names(), []string{"a", "b", "b2", "c", "d"}; !slices.Equal(got, want) {
			t.Fatalf("fired %v, want %v", got, want)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		for i, name := range r.fired {
			if r.at[i] < base+dues[name]*int64(time.Millisecond) {
				t.Errorf("%s fired at %d, before its due time %d", name, r.at[i]-base, dues[name]*int64(time.Millisecond))
			}
		}
	})
}

// TestStoppedAndRescheduledEntriesDoNotFireForTheirOldTime.
func TestStoppedAndRescheduledEntriesDoNotFireForTheirOldTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{})
		stop := runScheduler(t, s)
		defer stop()
		r := &recorder{}
		base := Now()
		a, b, c := newNamed(r, "a"), newNamed(r, "b"), newNamed(r, "c")
		s.Schedule(&a.Entry, base+int64(10*time.Millisecond))
		s.Schedule(&b.Entry, base+int64(20*time.Millisecond))
		s.Schedule(&c.Entry, base+int64(30*time.Millisecond))
		if !s.Stop(&a.Entry) || s.Stop(&a.Entry) {
			t.Fatal("Stop of a scheduled entry must report true once")
		}
		s.Schedule(&c.Entry, base+int64(5*time.Millisecond)) // earlier: must wake the loop
		time.Sleep(15 * time.Millisecond)
		synctest.Wait()
		if got := r.names(); !slices.Equal(got, []string{"c"}) {
			t.Fatalf("after 15ms fired %v, want [c]", got)
		}
		time.Sleep(20 * time.Millisecond)
		synctest.Wait()
		if got := r.names(); !slices.Equal(got, []string{"c", "b"}) {
			t.Fatalf("fired %v, want [c b]", got)
		}
		if n, _ := s.Len(); n != 0 {
			t.Errorf("Len = %d, want 0", n)
		}
	})
}

// TestPeriodicEntryReschedulesItselfFromFire: a Firer may schedule its own
// entry again (a periodic timer) and stop other entries.
func TestPeriodicEntryReschedulesItselfFromFire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{})
		stop := runScheduler(t, s)
		defer stop()
		r := &recorder{}
		p := newNamed(r, "tick")
		p.then = func(n *named, now int64) { s.Schedule(&n.Entry, n.Due()+int64(100*time.Millisecond)) }
		s.Schedule(&p.Entry, Now()+int64(100*time.Millisecond))
		time.Sleep(1050 * time.Millisecond)
		synctest.Wait()
		if got := len(r.names()); got != 10 {
			t.Fatalf("periodic entry fired %d times in 1.05 s at 100 ms, want 10", got)
		}
		s.Stop(&p.Entry)
		time.Sleep(time.Second)
		synctest.Wait()
		if got := len(r.names()); got != 10 {
			t.Fatalf("stopped periodic entry fired again: %d fires", got)
		}
	})
}

// TestCatchUpQueueIsRateLimitedAndDoesNotDelayTheSchedule: a backlog of
// overdue entries fires at CatchUpRate, in FIFO order, while entries of
// the schedule keep firing on time.
func TestCatchUpQueueIsRateLimitedAndDoesNotDelayTheSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var lateMu sync.Mutex
		var worst time.Duration
		s := New(Config{CatchUpRate: 100, CatchUpBurst: 10, Lag: func(d time.Duration) {
			lateMu.Lock()
			worst = max(worst, d)
			lateMu.Unlock()
		}})
		stop := runScheduler(t, s)
		defer stop()
		r := &recorder{}
		for i := range 300 {
			s.CatchUp(&newNamed(r, "c"+string(rune('0'+i%10))).Entry)
		}
		on := newNamed(r, "on-time")
		s.Schedule(&on.Entry, Now()+int64(500*time.Millisecond))
		time.Sleep(time.Second)
		synctest.Wait()
		got := r.names()
		catch := 0
		for _, n := range got {
			if n != "on-time" {
				catch++
			}
		}
		// 10 at once, then 100/s: about 110 in the first second.
		if catch < 100 || catch > 120 {
			t.Errorf("catch-up fired %d entries in 1 s at 100/s with burst 10, want ~110", catch)
		}
		if !slices.Contains(got, "on-time") {
			t.Error("the scheduled entry did not fire on time behind the catch-up backlog")
		}
		lateMu.Lock()
		if worst > 0 {
			t.Errorf("scheduled entry fired %v late", worst)
		}
		lateMu.Unlock()
		_, left := s.Len()
		if left != 300-catch {
			t.Errorf("catch-up queue holds %d, want %d", left, 300-catch)
		}
	})
}

// TestStopRemovesAnEntryFromTheCatchUpQueue.
func TestStopRemovesAnEntryFromTheCatchUpQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{CatchUpRate: 10, CatchUpBurst: 1})
		r := &recorder{}
		a, b, c := newNamed(r, "a"), newNamed(r, "b"), newNamed(r, "c")
		s.CatchUp(&a.Entry)
		s.CatchUp(&b.Entry)
		s.CatchUp(&c.Entry)
		if !s.Stop(&b.Entry) {
			t.Fatal("Stop of a queued entry reported false")
		}
		s.Schedule(&c.Entry, Now()+int64(time.Hour)) // moves it out of the queue
		stop := runScheduler(t, s)
		defer stop()
		time.Sleep(time.Second)
		synctest.Wait()
		if got := r.names(); !slices.Equal(got, []string{"a"}) {
			t.Fatalf("fired %v, want [a]", got)
		}
		if !s.Scheduled(&c.Entry) || s.Scheduled(&b.Entry) {
			t.Error("Scheduled: c must wait in the schedule, b nowhere")
		}
	})
}

// TestHeapKeepsOrderUnderRandomOperations cross-checks the heap against a
// sorted reference under many schedules and stops.
func TestHeapKeepsOrderUnderRandomOperations(t *testing.T) {
	s := New(Config{})
	r := &recorder{}
	es := make([]*named, 500)
	for i := range es {
		es[i] = newNamed(r, "")
	}
	state := uint64(1)
	rnd := func(n int) int { state = state*6364136223846793005 + 1442695040888963407; return int(state>>33) % n }
	live := map[*named]int64{}
	for range 20000 {
		e := es[rnd(len(es))]
		if rnd(4) == 0 {
			if got, want := s.Stop(&e.Entry), live[e] != 0; got != want {
				t.Fatalf("Stop = %v, want %v", got, want)
			}
			delete(live, e)
			continue
		}
		due := int64(rnd(1000) + 1)
		s.Schedule(&e.Entry, due)
		live[e] = due
	}
	var prev int64
	n := 0
	for {
		batch, _, _ := s.pop(1<<62, nil, nil)
		if len(batch) == 0 {
			break
		}
		for _, e := range batch {
			n++
			if e.due < prev {
				t.Fatalf("popped due %d after %d", e.due, prev)
			}
			prev = e.due
			if live[e.F.(*named)] != e.due {
				t.Fatalf("popped an entry at %d, last scheduled at %d", e.due, live[e.F.(*named)])
			}
		}
	}
	if n != len(live) {
		t.Fatalf("popped %d entries, %d scheduled", n, len(live))
	}
}

// BenchmarkScheduleAndFire: one schedule plus one pop of an entry among
// 1 000 000 scheduled ones.
func BenchmarkScheduleAndFire(b *testing.B) {
	s := New(Config{})
	r := &recorder{}
	const n = 1_000_000
	es := make([]*named, n)
	for i := range es {
		es[i] = newNamed(r, "")
		s.Schedule(&es[i].Entry, int64(i)*1000)
	}
	batch := make([]*Entry, 0, batchSize)
	now := int64(0)
	i := 0
	for b.Loop() {
		batch, _, _ = s.pop(now, batch[:0], nil)
		for _, e := range batch {
			s.Schedule(e, e.due+n*1000)
		}
		now += 1000
		i++
	}
}
