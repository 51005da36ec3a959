package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/shardhost/shardhost/runner"
)

// The gateway's HTTP API (-api): POST IncPath asks counter {id} to add
// one, POST RemindPath to add one in remindDelay by a reminder.
const (
	IncPath     = "/counters/{id}/inc"
	RemindPath  = "/counters/{id}/remind"
	remindDelay = 100 * time.Millisecond
)

// apiHandler serves a gateway's HTTP API: POST IncPath or RemindPath asks
// the counter, within askTimeout, and answers its value and the runner
// that served it ({"value":3,"runner":"runner-1"}). An ask that may have
// run answers 502, one that timed out 504, one not sent 503 (safe to
// retry).
func apiHandler(gw *runner.Runner) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+IncPath, func(w http.ResponseWriter, req *http.Request) {
		ctx, cancel := context.WithTimeout(req.Context(), askTimeout)
		defer cancel()
		resp, err := Inc.Ask(ctx, gw, req.PathValue("id"), IncReq{})
		answer(w, resp, err)
	})
	mux.HandleFunc("POST "+RemindPath, func(w http.ResponseWriter, req *http.Request) {
		ctx, cancel := context.WithTimeout(req.Context(), askTimeout)
		defer cancel()
		resp, err := Remind.Ask(ctx, gw, req.PathValue("id"), RemindReq{Delay: remindDelay})
		answer(w, resp, err)
	})
	return mux
}

// answer writes an ask's outcome.
func answer(w http.ResponseWriter, resp IncResp, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		code := http.StatusServiceUnavailable
		switch {
		case errors.Is(err, runner.ErrMaybeDelivered):
			code = http.StatusBadGateway
		case errors.Is(err, context.DeadlineExceeded):
			code = http.StatusGatewayTimeout
		}
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	_ = json.NewEncoder(w).Encode(apiResp{Value: resp.Value, Runner: resp.Runner})
}

// apiResp is the body of a served POST IncPath.
type apiResp struct {
	Value  int64  `json:"value"`
	Runner string `json:"runner"`
}
