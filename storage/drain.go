package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// KeyspaceDrains holds drain requests, drains/{runnerID}: an operator's
// request (cmd/shardhostctl drain) that the runner with that ID take no
// shards. The keys have no lease: a request outlives the runner's
// processes, so a restarted runner registers drained until the request is
// deleted (undrain). The runner honours its own key by publishing its
// record with Draining set (its weight kept); every runner assigns a
// draining runner no shard, so its shards leave by handoff.
const KeyspaceDrains Keyspace = "drains"

// DrainRequest is the value of drains/{runnerID}.
type DrainRequest struct {
	Requested time.Time `json:"requested"`
	By        string    `json:"by,omitempty"`     // who asked (user@host)
	Reason    string    `json:"reason,omitempty"` // free text
}

// DrainKey is the key of runner id's drain request relative to the
// namespace.
func DrainKey(id string) string { return Key(KeyspaceDrains, id) }

// EncodeDrain returns the stored form of a drain request for runner id.
// An invalid id (see [ValidateRunnerID]), a Requested time outside years
// 0-9999 or a By or Reason that is not valid UTF-8 (JSON would store
// another text) fails with ErrInvalidArgument.
func EncodeDrain(id string, req DrainRequest) ([]byte, error) {
	if err := ValidateRunnerID(id); err != nil {
		return nil, err
	}
	switch {
	case req.Requested.Year() < 0 || req.Requested.Year() > 9999:
		return nil, fmt.Errorf("%w: drain request for %q: time %v outside years 0-9999", ErrInvalidArgument, id, req.Requested)
	case !utf8.ValidString(req.By) || !utf8.ValidString(req.Reason):
		return nil, fmt.Errorf("%w: drain request for %q: by %q and reason %q must be valid UTF-8", ErrInvalidArgument, id, req.By, req.Reason)
	}
	return json.Marshal(req)
}

// DecodeDrain decodes a key of KeyspaceDrains: the runner ID it names and
// the request. Errors are *CorruptError; a request with a valid key still
// names its runner (any value at the key asks for the drain).
func DecodeDrain(kv KeyValue) (string, DrainRequest, error) {
	var req DrainRequest
	if err := ValidateRunnerID(kv.Key); err != nil {
		return "", req, &CorruptError{Keyspace: KeyspaceDrains, Key: kv.Key, Err: err}
	}
	obj, err := parseObject(kv.Value)
	if err == nil {
		err = errors.Join(
			member(obj, "requested", true, &req.Requested),
			member(obj, "by", false, &req.By),
			member(obj, "reason", false, &req.Reason),
		)
	}
	if err != nil {
		return kv.Key, req, &CorruptError{Keyspace: KeyspaceDrains, Key: kv.Key, Err: fmt.Errorf("drain request: %w", err)}
	}
	return kv.Key, req, nil
}
