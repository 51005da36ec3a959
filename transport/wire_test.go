package transport

import (
	"errors"
	"testing"
)

func TestWireRoundTrip(t *testing.T) {
	req := &DeliverRequest{Kind: "k", Method: "m", Entity: "e/1", Payload: []byte{0, 1, 2}, OneWay: true, Shard: 77, Sender: "s", Codec: "json"}
	var got DeliverRequest
	if err := got.Unmarshal(req.Marshal()); err != nil || got.Kind != "k" || got.Entity != "e/1" || !got.OneWay || got.Shard != 77 || string(got.Payload) != "\x00\x01\x02" || got.Codec != "json" || got.Sender != "s" {
		t.Fatalf("request round trip = %+v, %v", got, err)
	}
	resp := &DeliverResponse{Payload: []byte("p"), Code: CodeNotOwner, Message: "m", OwnerHint: "h", Shard: 3, Cause: CauseShutdown, Epoch: 1 << 33}
	var gr DeliverResponse
	if err := gr.Unmarshal(resp.Marshal()); err != nil || gr.Code != CodeNotOwner || gr.OwnerHint != "h" || gr.Cause != CauseShutdown || string(gr.Payload) != "p" || gr.Epoch != 1<<33 {
		t.Fatalf("response round trip = %+v, %v", gr, err)
	}
	f := &frame{ID: 1 << 40, Req: req, Resp: resp, TimeoutMs: 1500, GoAway: true}
	var gf frame
	if err := gf.Unmarshal(f.Marshal()); err != nil || gf.ID != 1<<40 || gf.TimeoutMs != 1500 || !gf.GoAway ||
		gf.Req == nil || gf.Req.Entity != "e/1" || gf.Resp == nil || gf.Resp.OwnerHint != "h" {
		t.Fatalf("frame round trip = %+v, %v", gf, err)
	}
	hot := &hotResponse{Entities: []EntityRef{{Kind: "k", ID: "a"}, {Kind: "k2", ID: "b"}}}
	var gh hotResponse
	if err := gh.Unmarshal(hot.Marshal()); err != nil || len(gh.Entities) != 2 || gh.Entities[1].ID != "b" {
		t.Fatalf("hot round trip = %+v, %v", gh, err)
	}
	if err := gr.Unmarshal([]byte{0xff, 0xff}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("unmarshal(garbage) = %v, want ErrMalformed", err)
	}
}
