package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/shardhost/shardhost/runner"
)

// IncPath is the gateway's HTTP API (-api): POST asks counter {id} to add
// one.
const IncPath = "/counters/{id}/inc"

// apiHandler serves a gateway's HTTP API: POST IncPath asks the counter,
// within askTimeout, and answers its new value and the runner that served
// it ({"value":3,"runner":"runner-1"}). An ask that may have run answers
// 502, one that timed out 504, one not sent 503 (safe to retry).
func apiHandler(gw *runner.Runner) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+IncPath, func(w http.ResponseWriter, req *http.Request) {
		ctx, cancel := context.WithTimeout(req.Context(), askTimeout)
		defer cancel()
		resp, err := Inc.Ask(ctx, gw, req.PathValue("id"), IncReq{})
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
	})
	return mux
}

// apiResp is the body of a served POST IncPath.
type apiResp struct {
	Value  int64  `json:"value"`
	Runner string `json:"runner"`
}
