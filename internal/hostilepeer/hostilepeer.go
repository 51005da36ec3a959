// Package hostilepeer is a hostile peer of a runner's transport, for
// tests: it reaches a transport server (transport.GRPC) over gRPC, with or
// without TLS, and sends what no runner sends — messages built byte by
// byte to make a decoder allocate, floods of requests whose answers it
// never reads, streams beyond what the server allows — on each RPC of the
// service (transport/transport.proto). It also measures what that costs
// the process the server runs in (Watch).
//
// It imports nothing of the module: the messages are written with
// protowire from the field numbers of transport.proto.
package hostilepeer

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
)

// The RPCs of the service, by their gRPC method names.
const (
	Frames  = "/shardhost.v1.Runner/Frames"  // stream of batches of frames
	Stream  = "/shardhost.v1.Runner/Stream"  // stream of frames (the previous version's)
	Deliver = "/shardhost.v1.Runner/Deliver" // unary
)

// rawCodec sends and receives messages as the bytes given (*[]byte).
type rawCodec struct{}

func (rawCodec) Name() string { return "shardhost-v1" }

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }

func (rawCodec) Unmarshal(b []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), b...)
	return nil
}

// Peer is a gRPC connection to a transport server. It reads none of the
// answers it is sent unless told to: its HTTP/2 windows are 64 KiB (no
// window probing), so a server answering it is held back once that much
// is unread.
type Peer struct {
	cc *grpc.ClientConn
}

// Dial connects to addr, with TLS when cfg is not nil.
func Dial(addr string, cfg *tls.Config) (*Peer, error) {
	creds := insecure.NewCredentials()
	if cfg != nil {
		creds = credentials.NewTLS(cfg)
	}
	cc, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallSendMsgSize(1<<30), grpc.MaxCallRecvMsgSize(1<<30)),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10),
	)
	if err != nil {
		return nil, err
	}
	return &Peer{cc: cc}, nil
}

// Close closes the connection (every stream on it ends).
func (p *Peer) Close() { _ = p.cc.Close() }

// Open opens a stream of method (Frames, Stream, or Deliver as a stream
// whose answer is never read) that ends with ctx.
func (p *Peer) Open(ctx context.Context, method string) (*Conversation, error) {
	desc := &grpc.StreamDesc{ServerStreams: method != Deliver, ClientStreams: method != Deliver}
	cs, err := p.cc.NewStream(ctx, desc, method)
	if err != nil {
		return nil, err
	}
	return &Conversation{cs: cs}, nil
}

// Conversation is one stream. Send and Finish are not safe for concurrent
// use.
type Conversation struct {
	cs   grpc.ClientStream
	sent atomic.Int64 // bytes
}

// Send sends msg as one message. It blocks while the server reads no
// more (HTTP/2 flow control).
func (c *Conversation) Send(msg []byte) error {
	if err := c.cs.SendMsg(&msg); err != nil {
		return err
	}
	c.sent.Add(int64(len(msg)))
	return nil
}

// Sent returns the bytes of the messages sent so far.
func (c *Conversation) Sent() int64 { return c.sent.Load() }

// Finish closes the sending side and reads every answer until the stream
// ends: nil when the server ended it cleanly, else its status.
func (c *Conversation) Finish() (answers int, err error) {
	if err := c.cs.CloseSend(); err != nil {
		return 0, err
	}
	for {
		var b []byte
		if err := c.cs.RecvMsg(&b); err != nil {
			if errors.Is(err, io.EOF) {
				return answers, nil
			}
			return answers, err
		}
		answers++
	}
}

// Flood sends msg on c again and again, until n were sent, ctx ends or a
// send fails; the number sent is returned. Once the server stops
// reading, a send blocks until ctx ends (c's stream must end with it).
func (c *Conversation) Flood(ctx context.Context, msg []byte, n int) int {
	i := 0
	for ; i < n && ctx.Err() == nil; i++ {
		if err := c.Send(msg); err != nil {
			break
		}
	}
	return i
}

// FloodUntilHeld sends msg on c until the server stops reading — no send
// completes for stall, and held reports true (nil: always) — or n were
// sent, and returns how many were. It calls tick every 20 ms meanwhile
// (nil: nothing).
func (c *Conversation) FloodUntilHeld(msg []byte, n int, stall time.Duration, held func() bool, tick func()) int {
	done := make(chan int, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- c.Flood(ctx, msg, n) }()
	last, since := int64(-1), time.Now()
	for {
		if tick != nil {
			tick()
		}
		select {
		case k := <-done:
			return k
		case <-time.After(20 * time.Millisecond):
		}
		if s := c.Sent(); s != last {
			last, since = s, time.Now()
		} else if time.Since(since) > stall && (held == nil || held()) {
			return int(last / int64(len(msg)))
		}
	}
}

// --- messages (transport.proto) ---

// Request is a DeliverRequest asking kind.method of entity with payload.
func Request(kind, method, entity string, payload []byte) []byte {
	var b []byte
	b = protowire.AppendBytes(protowire.AppendTag(b, 1, protowire.BytesType), []byte(kind))
	b = protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), []byte(method))
	b = protowire.AppendBytes(protowire.AppendTag(b, 3, protowire.BytesType), []byte(entity))
	if len(payload) > 0 {
		b = protowire.AppendBytes(protowire.AppendTag(b, 4, protowire.BytesType), payload)
	}
	return b
}

// Frame is a Frame with id carrying req (a DeliverRequest's encoding).
func Frame(id uint64, req []byte) []byte {
	b := protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), id)
	return protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), req)
}

// Batch is a Frames message of frames (Frame's encodings).
func Batch(frames ...[]byte) []byte {
	var b []byte
	for _, f := range frames {
		b = protowire.AppendBytes(protowire.AppendTag(b, 1, protowire.BytesType), f)
	}
	return b
}

// RequestBatch is a Frames message of n frames with IDs from first, each
// carrying req.
func RequestBatch(first uint64, n int, req []byte) []byte {
	fs := make([][]byte, n)
	for i := range fs {
		fs[i] = Frame(first+uint64(i), req)
	}
	return Batch(fs...)
}

// EmptyFrames is a Frames message of size bytes: empty frames (2 bytes
// each).
func EmptyFrames(size int) []byte { return bytes.Repeat([]byte{0x0a, 0x00}, size/2) }

// TinyFrames is a Frames message of n of the smallest frames a decoder
// keeps: an ID only (4 bytes each).
func TinyFrames(n int) []byte { return bytes.Repeat([]byte{0x0a, 0x02, 0x08, 0x01}, n) }

// RepeatedRequest is a Frame of about size bytes whose request field is
// repeated: empty requests (2 bytes each), then req.
func RepeatedRequest(size int, req []byte) []byte {
	b := bytes.Repeat([]byte{0x12, 0x00}, size/2)
	return append(b, Frame(1, req)...)
}

// RepeatedStrings is a DeliverRequest of about size bytes whose kind is
// repeated (distinct 2-byte strings), then the fields of req.
func RepeatedStrings(size int, req []byte) []byte {
	b := make([]byte, 0, size+len(req))
	for i := 0; len(b) < size; i++ {
		b = append(b, 0x0a, 0x02, byte('a'+i%26), byte('a'+i/26%26))
	}
	return append(b, req...)
}

// GiantHeaders is a DeliverRequest of about size bytes of header
// entries (field 9): many small distinct ones, then a few of 1 MiB
// values, then the fields of req.
func GiantHeaders(size int, req []byte) []byte {
	var b []byte
	entry := func(k, v []byte) {
		e := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), k)
		e = protowire.AppendBytes(protowire.AppendTag(e, 2, protowire.BytesType), v)
		b = protowire.AppendBytes(protowire.AppendTag(b, 9, protowire.BytesType), e)
	}
	for i := 0; len(b) < size/2; i++ {
		entry(fmt.Appendf(nil, "k%d", i), []byte("v"))
	}
	big := bytes.Repeat([]byte{'x'}, 1<<20)
	for i := 0; len(b) < size-len(big); i++ {
		entry(fmt.Appendf(nil, "big%d", i), big)
	}
	return append(b, req...)
}

// --- HTTP/2 below gRPC: streams beyond the server's limit ---

// RawConn is an HTTP/2 connection that opens gRPC streams as a client
// ignoring the server's SETTINGS would: as many as it likes. It reads
// what the server sends only to count the streams it refuses, and never
// gives back flow-control window: it reads no answer.
type RawConn struct {
	conn    net.Conn
	fr      *http2.Framer
	mu      sync.Mutex // writes
	henc    *hpack.Encoder
	hbuf    bytes.Buffer
	next    uint32
	refused atomic.Int64 // streams reset by the server (RST_STREAM)
	done    chan struct{}
}

// DialRaw opens an HTTP/2 connection to addr (TLS with ALPN h2 when cfg
// is not nil).
func DialRaw(addr string, cfg *tls.Config) (*RawConn, error) {
	var conn net.Conn
	var err error
	if cfg != nil {
		cfg = cfg.Clone()
		cfg.NextProtos = []string{"h2"}
		conn, err = tls.Dial("tcp", addr, cfg)
	} else {
		conn, err = net.Dial("tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	c := &RawConn{conn: conn, fr: http2.NewFramer(conn, conn), next: 1, done: make(chan struct{})}
	c.henc = hpack.NewEncoder(&c.hbuf)
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		_ = conn.Close()
		return nil, err
	}
	if err := c.fr.WriteSettings(); err != nil {
		_ = conn.Close()
		return nil, err
	}
	go c.read()
	return c, nil
}

func (c *RawConn) read() {
	defer close(c.done)
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			c.refused.Add(1)
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.mu.Lock()
				_ = c.fr.WriteSettingsAck()
				c.mu.Unlock()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				c.mu.Lock()
				_ = c.fr.WritePing(true, f.Data)
				c.mu.Unlock()
			}
		}
	}
}

// Open opens a stream of method and sends msg on it (gRPC-framed), its
// sending side left open.
func (c *RawConn) Open(method string, msg []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hbuf.Reset()
	for _, h := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", "runner"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		if err := c.henc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]}); err != nil {
			return err
		}
	}
	id := c.next
	c.next += 2
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true}); err != nil {
		return err
	}
	data := make([]byte, 5, 5+len(msg))
	data[1], data[2], data[3], data[4] = byte(len(msg)>>24), byte(len(msg)>>16), byte(len(msg)>>8), byte(len(msg))
	return c.fr.WriteData(id, false, append(data, msg...))
}

// Refused returns the streams the server reset so far.
func (c *RawConn) Refused() int64 { return c.refused.Load() }

// Close closes the connection.
func (c *RawConn) Close() {
	_ = c.conn.Close()
	<-c.done
}

// --- what it costs ---

// Watch samples the live heap of the process every millisecond and
// keeps the most it saw, until Stop. The heap it samples holds garbage
// not yet collected, as much as the collector lets grow: a Watch sets
// the collector to its default (GOGC=100) while it runs, so that what it
// measures is the code's, whatever GOGC the process was started with.
type Watch struct {
	start, peak         uint64
	liveStart, livePeak uint64
	allocStart          uint64
	stop                chan struct{}
	done                chan struct{}
}

// heapObjects reads the bytes of live and not yet swept heap objects.
func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// heapLive is the heap the last collection found reachable.
func heapLive() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// gcPin counts the Watches running; the first sets the collector to its
// default and keeps the setting it found, the last gives it back.
var gcPin struct {
	sync.Mutex
	watches int
	percent int
}

func pinGC() {
	gcPin.Lock()
	defer gcPin.Unlock()
	if gcPin.watches++; gcPin.watches == 1 {
		gcPin.percent = debug.SetGCPercent(100)
	}
}

func unpinGC() {
	gcPin.Lock()
	defer gcPin.Unlock()
	if gcPin.watches--; gcPin.watches == 0 {
		debug.SetGCPercent(gcPin.percent)
	}
}

// StartWatch sets the collector to its default, collects garbage, then
// starts a Watch.
func StartWatch() *Watch {
	pinGC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	w := &Watch{start: heapObjects(), liveStart: heapLive(), allocStart: ms.TotalAlloc, stop: make(chan struct{}), done: make(chan struct{})}
	w.peak, w.livePeak = w.start, w.liveStart
	go func() {
		defer close(w.done)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			w.peak = max(w.peak, heapObjects())
			w.livePeak = max(w.livePeak, heapLive())
			select {
			case <-t.C:
			case <-w.stop:
				return
			}
		}
	}()
	return w
}

// LiveGrowth returns, once Stop returned, the most the live heap grew:
// the heap a collection found reachable, at every collection while the
// watch ran and at one Stop makes — what the code held, without the
// garbage that piles up while a collector starved of CPU (a loaded
// machine) is late, which the peak Stop returns includes.
func (w *Watch) LiveGrowth() uint64 {
	if w.livePeak > w.liveStart {
		return w.livePeak - w.liveStart
	}
	return 0
}

// Stop ends the watch: the most the heap grew while it ran (live and not
// yet swept objects, sampled), and the bytes allocated meanwhile. It
// gives the collector back its setting.
func (w *Watch) Stop() (peakGrowth, allocated uint64) {
	close(w.stop)
	<-w.done
	runtime.GC() // what is held now counts in LiveGrowth
	w.livePeak = max(w.livePeak, heapLive())
	unpinGC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if w.peak > w.start {
		peakGrowth = w.peak - w.start
	}
	return peakGrowth, ms.TotalAlloc - w.allocStart
}
