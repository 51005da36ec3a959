package runnerproc

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// History record kinds: what a child appends to its history file
// (Spec.History), one JSON Record per line.
const (
	HistStart      = "start"      // a Counter handler starts: Shard, Epoch, Entity, Inst, Lease, Deadline (the runner's, at the start)
	HistEnd        = "end"        // it returns: Value, Err
	HistCheckpoint = "checkpoint" // a fenced checkpoint write returned: Value, Epoch, OK, Err (Mono: when it returned)
	HistActivate   = "activate"   // an instance activated: Inst, Epoch, Value (restored), Detail (reason)
	HistRelease    = "release"    // its Release hook checkpointed: Value, OK, Err
	HistRegistered = "registered" // the runner registered: Lease
	HistReattached = "reattached" // re-attached: Lease
	HistDetached   = "detached"   // detached: Deadline (its lease deadline then), Detail (reason)
	HistAcquired   = "acquired"   // a shard became owned: Shard, Epoch
	HistReleased   = "released"   // a shard was released or handed off: Shard, Epoch
	HistLost       = "lost"       // a shard was lost: Shard, Epoch, Detail
	// A reminder tick's handler ran (between its start and end records):
	// Shard, Epoch, Entity, Inst, Detail (the reminder's name), Tick,
	// Missed, Redelivered.
	HistFire = "fire"
	// A plain release could not record which reminder ticks fired (the
	// next owner fires them at least once): Shard, Epoch, Err.
	HistUnrecorded = "unrecorded"
	// Always-on work (always.go). A singleton's or the shard worker's
	// body started: Entity (its name), Shard, Epoch, Inst (the run,
	// numbered per process), Detail (RunSingleton or RunWorker), Err (its
	// context's cause when it had already ended).
	HistRun = "run"
	// The body returned (its context ended): Entity, Shard, Epoch, Inst,
	// Detail (EndClass of the cause), Err (the cause).
	HistRunEnd = "run-end"
	// A Keeper activated: Entity, Shard, Epoch, Inst (the life, numbered
	// per process), Detail (the activation reason), Err (its context's
	// cause when it had already ended).
	HistLife = "life"
	// Its life ended (its Release hook or the end of its context,
	// whichever came first): Entity, Shard, Epoch, Inst, Detail (EndClass
	// of the cause), Err (the cause).
	HistLifeEnd = "life-end"
	// The process was not scheduled (testenv.ProbeStalls): the stall
	// ended at Mono and lasted Value nanoseconds.
	HistStall = "stall"
)

// Record is one line of a history file. Times are CLOCK_MONOTONIC
// nanoseconds ([Mono]): on Linux that clock is one for the whole system,
// so records of different processes compare directly, whatever the wall
// clock does.
type Record struct {
	Kind     string `json:"k"`
	Mono     int64  `json:"t"`
	PID      int    `json:"pid"`
	Runner   string `json:"r,omitempty"`
	Shard    int    `json:"s"`
	Epoch    int64  `json:"ep,omitempty"`
	Lease    int64  `json:"l,omitempty"`
	Entity   string `json:"e,omitempty"`
	Inst     int64  `json:"i,omitempty"` // the entity instance, numbered per process from 1
	Value    int64  `json:"v,omitempty"`
	Deadline int64  `json:"dl,omitempty"` // a lease deadline, CLOCK_MONOTONIC
	OK       bool   `json:"ok,omitempty"`
	Err      string `json:"err,omitempty"`
	Detail   string `json:"d,omitempty"`
	// A reminder tick (HistFire).
	Tick        uint64 `json:"tk,omitempty"`
	Missed      uint64 `json:"ms,omitempty"`
	Redelivered bool   `json:"rd,omitempty"`
}

// Mono returns CLOCK_MONOTONIC in nanoseconds.
func Mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("runnerproc: clock_gettime: %v", err))
	}
	return ts.Nano()
}

// MonoOf converts t, a time taken in this process (with a monotonic
// reading), to CLOCK_MONOTONIC nanoseconds.
func MonoOf(t time.Time) int64 { return Mono() - int64(time.Since(t)) }

// historyFile appends records with one write(2) each to a file opened
// O_APPEND: a record is in the kernel (and survives SIGKILL of the
// process) as soon as append returns, and is never split.
type historyFile struct {
	mu     sync.Mutex
	f      *os.File
	pid    int
	runner string
	buf    []byte
}

func openHistory(path, runner string) (*historyFile, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("runnerproc: history: %w", err)
	}
	return &historyFile{f: f, pid: os.Getpid(), runner: runner}, nil
}

// append writes rec, stamping its process, runner and (if unset) time.
// A nil history writes nothing.
func (h *historyFile) append(rec Record) {
	if h == nil {
		return
	}
	if rec.Mono == 0 {
		rec.Mono = Mono()
	}
	rec.PID, rec.Runner = h.pid, h.runner
	h.mu.Lock()
	defer h.mu.Unlock()
	b, err := json.Marshal(rec)
	if err != nil {
		return
	}
	h.buf = append(append(h.buf[:0], b...), '\n')
	if _, err := h.f.Write(h.buf); err != nil {
		fmt.Fprintf(os.Stderr, "runnerproc: history: %v\n", err)
	}
}

func (h *historyFile) close() error {
	if h == nil {
		return nil
	}
	return h.f.Close()
}

// ReadHistory reads a history file. A last line cut short (the process
// was killed while writing it cannot happen with one write per record,
// but the file may be read while a child still writes) is ignored.
func ReadHistory(path string) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readHistory(f)
}

func readHistory(r io.Reader) ([]Record, error) {
	var recs []Record
	br := bufio.NewReaderSize(r, 1<<16)
	for line := 1; ; line++ {
		b, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return recs, nil // a partial last line is ignored
		}
		if err != nil {
			return recs, err
		}
		var rec Record
		if err := json.Unmarshal(b, &rec); err != nil {
			return recs, fmt.Errorf("runnerproc: history line %d: %w", line, err)
		}
		recs = append(recs, rec)
	}
}
