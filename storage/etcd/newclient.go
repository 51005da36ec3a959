package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/storage"
)

// probeBound bounds NewClient's TLS probes of the endpoints, together.
const probeBound = 3 * time.Second

// NewClient returns clientv3.New(cfg) or, when that fails, an error that
// names the cause. A client with a user (cfg.Username) logs in while it is
// made, so an etcd it cannot reach fails here — where the etcd client
// says only "context deadline exceeded" after cfg.DialTimeout, whatever
// the cause. NewClient then asks each endpoint what a TLS handshake with
// cfg.TLS finds (ProbeTLS, concurrently, at most 3 s in all) and adds
// each finding: a refused connection, a plaintext etcd given TLS or a TLS
// etcd given none (ErrTLSMismatch), an unknown authority, a certificate
// the server requires or refuses. The error matches
// storage.ErrPermissionDenied for a refused login (wrong password or
// user) and storage.ErrUnavailable otherwise (see TranslateError), and
// ErrTLSMismatch when a probe found one.
func NewClient(cfg clientv3.Config) (*clientv3.Client, error) {
	cli, err := clientv3.New(cfg)
	if err == nil {
		return cli, nil
	}
	err = fmt.Errorf("etcd client for %s: %w", strings.Join(cfg.Endpoints, ","), translate(err))
	if !errors.Is(err, storage.ErrUnavailable) {
		return nil, err
	}
	ctx := cfg.Context
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, probeBound)
	defer cancel()
	found := make([]error, len(cfg.Endpoints))
	var wg sync.WaitGroup
	for i, ep := range cfg.Endpoints {
		wg.Go(func() { found[i] = ProbeTLS(ctx, ep, cfg.TLS) })
	}
	wg.Wait()
	format, args := "%w", []any{err}
	for _, f := range found {
		if f == nil {
			continue
		}
		if len(args) == 1 {
			format += " ("
		} else {
			format += "; "
		}
		format += "%w"
		args = append(args, f)
	}
	if len(args) == 1 { // every endpoint handshakes: the probes have nothing to add
		return nil, err
	}
	return nil, fmt.Errorf(format+")", args...)
}
