package linearize

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// WriteHistory writes ops as JSON, one operation per line, for
// ReadHistory to read back (a harness keeps a run's history with its
// files, and the check can be run again on it).
func WriteHistory(w io.Writer, ops []Op) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for _, op := range ops {
		if err := enc.Encode(op); err != nil {
			return fmt.Errorf("linearize: write history: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("linearize: write history: %w", err)
	}
	return nil
}

// ReadHistory reads a history WriteHistory wrote.
func ReadHistory(r io.Reader) ([]Op, error) {
	var ops []Op
	dec := json.NewDecoder(r)
	for {
		var op Op
		err := dec.Decode(&op)
		if errors.Is(err, io.EOF) {
			return ops, nil
		}
		if err != nil {
			return ops, fmt.Errorf("linearize: read history, operation %d: %w", len(ops), err)
		}
		ops = append(ops, op)
	}
}
