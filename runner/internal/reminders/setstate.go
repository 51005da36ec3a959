package reminders

import "fmt"

// The control state of a shard's reminder set (one shard at one epoch) is
// one state machine, setState, changed only by shardSet.toLocked with an
// event that next accepts. The table of legal transitions, and the proof
// that every state a set can reach leads back to firing, are
// setstate_internal_test.go.
//
// Its parts: loaded (the shard's reminders are installed; before, a read
// of the store is pending); paused (a cutover is under way: from Pause to
// Resume or Stop); final (the final progress record the store may hold
// for the shard, which must be rewritten as not final before the set
// fires — none, theirs: the predecessor's, loaded; ours: computed by
// Progress for a cutover or a release, and written, or maybe landing
// late); rewriting (that rewrite is in flight); fenced (the shard's lock
// refused the rewrite: the shard moved on, and the runner stops the set
// when it sees the lock move); reread (the watchdog reloads the set: its
// state is read from the store again and merged); stopped (the ownership
// ended, final: only whether the set was loaded and whether a rewrite is
// still in flight are kept).
//
// Invariants (check):
//
//   - Nothing before the load: a set not loaded holds no final progress,
//     rewrites, rereads nothing and was fenced by nothing.
//   - A rewrite is of a final progress: rewriting or fenced implies a
//     final progress; a fenced set rewrites nothing.
//   - A reload reads first: a set to reread is neither rewriting nor
//     fenced.
//   - A stopped set keeps only loaded and rewriting.
//
// Liveness, by construction (TestEveryReminderSetStateLeadsBackToFiring):
// a set that is owned (not stopped), not paused and not fenced either
// fires or has one store call pending (work): the read that loads (or
// reloads) it, or the rewrite of its final progress (queued, or in
// flight). toLocked
// queues the set whenever its state asks for work, so no transition can
// leave it unqueued; a failed call is retried within maxRetry; a call
// that succeeds moves the set one step closer to firing (read, then
// rewrite, then fire: at most two calls). A paused set waits for the
// runner's cutover, which ends in Resume or Stop; a fenced one for the
// runner's Stop (or the watchdog's reload, which tries the rewrite
// again).
type setState struct {
	loaded    bool
	paused    bool
	stopped   bool
	final     finalKind
	rewriting bool
	fenced    bool
	reread    bool
}

// loadPending reports whether the set waits for its first load (counted
// by Service.Loading).
func (st setState) loadPending() bool { return !st.loaded && !st.stopped }

// finalKind is which final progress the store may hold that the set must
// rewrite as not final before it fires.
type finalKind uint8

const (
	finalNone   finalKind = iota // the store's progress is not final (or is absent)
	finalTheirs                  // the predecessor's final progress, loaded (or found by a reload)
	finalOurs                    // ours, computed by Progress: written, or maybe landing late
)

// setEvent is what moves a set's state.
type setEvent uint8

const (
	onLoad          setEvent = iota // its state was read and installed; the progress is not final
	onLoadFinal                     // ... the progress is final (the predecessor's)
	onPause                         // a cutover began (Pause)
	onResume                        // the cutover was given up (Resume)
	onProgress                      // Progress computed the set's final progress (paused, or stopped by a release)
	onRewrite                       // the rewrite of the final progress starts
	onRewritten                     // the store took it
	onRewriteFailed                 // it failed, or its outcome is unknown: tried again
	onRewriteFenced                 // the shard's lock refused it
	onReload                        // the watchdog reloads the set (a fenced rewrite is tried again after)
	onReread                        // the reload's read was merged; no final progress the set did not know of
	onRereadFinal                   // ... it found one
	onStop                          // the ownership ended (Stop, Forget, Acquired at a newer epoch)
	numSetEvents
)

func (e setEvent) String() string {
	return [...]string{"load", "load-final", "pause", "resume", "progress", "rewrite", "rewritten",
		"rewrite-failed", "rewrite-fenced", "reload", "reread", "reread-final", "stop"}[e]
}

// work is the store call a set's state asks for.
type work uint8

const (
	workNone    work = iota
	workRead         // read the shard's state and install (or merge) it
	workRewrite      // rewrite the final progress as not final
)

// next returns the state ev leads to from s, and false (with s) when s
// does not accept ev.
func (s setState) next(ev setEvent) (setState, bool) {
	switch ev {
	case onLoad, onLoadFinal:
		if s.loaded || s.stopped {
			return s, false
		}
		s.loaded = true
		if ev == onLoadFinal {
			s.final = finalTheirs
		}
		return s, true
	case onPause:
		if s.stopped || s.paused {
			return s, false
		}
		s.paused = true
		return s, true
	case onResume:
		if s.stopped || !s.paused {
			return s, false
		}
		s.paused = false
		return s, true
	case onProgress:
		switch {
		case !s.loaded || s.rewriting || !(s.paused || s.stopped):
			return s, false
		case !s.stopped:
			s.final = finalOurs
		}
		return s, true
	case onRewrite:
		if s.work() != workRewrite {
			return s, false
		}
		s.rewriting = true
		return s, true
	case onRewritten, onRewriteFailed, onRewriteFenced:
		if !s.rewriting {
			return s, false
		}
		s.rewriting = false
		if s.stopped {
			return s, true
		}
		switch ev {
		case onRewritten:
			s.final = finalNone
		case onRewriteFenced:
			s.fenced = true
		}
		return s, true
	case onReload:
		if !s.loaded || s.stopped || s.reread || s.rewriting {
			return s, false
		}
		s.reread, s.fenced = true, false
		return s, true
	case onReread, onRereadFinal:
		if !s.reread || s.paused || s.stopped {
			return s, false
		}
		s.reread = false
		if ev == onRereadFinal && s.final == finalNone {
			s.final = finalTheirs
		}
		return s, true
	case onStop:
		if s.stopped {
			return s, false
		}
		return setState{stopped: true, loaded: s.loaded, rewriting: s.rewriting}, true
	}
	return s, false
}

// fires reports whether the set fires its reminders.
func (s setState) fires() bool {
	return s.loaded && !s.paused && !s.stopped && s.final == finalNone
}

// activating reports whether the set activates its remembered entities:
// loaded, not in a cutover nor stopped (a final progress concerns the
// reminders only).
func (s setState) activating() bool {
	return s.loaded && !s.paused && !s.stopped
}

// work returns the store call the state asks for.
func (s setState) work() work {
	switch {
	case s.stopped || s.fenced:
		return workNone
	case !s.loaded:
		return workRead // also during a cutover: reading changes nothing it relies on
	case s.paused:
		return workNone // the cutover writes its own final progress next
	case s.reread:
		return workRead
	case s.final != finalNone && !s.rewriting:
		return workRewrite
	}
	return workNone
}

// cause says why a set that does not fire cannot (for the watchdog's log
// and metric): load, reload, rewrite or fenced; "" when it fires, is
// paused or is stopped.
func (s setState) cause() string {
	switch {
	case s.fires() || s.paused || s.stopped:
		return ""
	case !s.loaded:
		return "load"
	case s.reread:
		return "reload"
	case s.fenced:
		return "fenced"
	}
	return "rewrite"
}

// check returns the first invariant s breaks, or nil.
func (s setState) check() error {
	switch {
	case !s.loaded && (s.final != finalNone || s.rewriting || s.fenced || s.reread):
		return fmt.Errorf("not loaded, yet final %d, rewriting %v, fenced %v, reread %v", s.final, s.rewriting, s.fenced, s.reread)
	case s.stopped && (s.paused || s.final != finalNone || s.fenced || s.reread):
		return fmt.Errorf("stopped, yet paused %v, final %d, fenced %v, reread %v", s.paused, s.final, s.fenced, s.reread)
	case s.reread && (s.rewriting || s.fenced):
		return fmt.Errorf("to reread, yet rewriting %v, fenced %v", s.rewriting, s.fenced)
	case !s.stopped && (s.rewriting || s.fenced) && s.final == finalNone:
		return fmt.Errorf("rewriting %v or fenced %v without a final progress", s.rewriting, s.fenced)
	case s.rewriting && s.fenced:
		return fmt.Errorf("rewriting a fenced set")
	}
	return nil
}

// CheckInvariants makes toLocked check every state it enters and panic on
// a broken invariant (tests turn it on: this package's, and the runner's,
// whose simulation then checks every transition of every set).
var CheckInvariants = false
