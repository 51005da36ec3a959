package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
)

// frameSize is the raw floor's message: one 64-byte frame each way.
const frameSize = 64

// tcpFloor is the raw loopback TCP echo: each caller has its own
// connection and makes one write and one read per message. It has no
// local mode.
type tcpFloor struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func newTCPFloor() (remoteNodes, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	t := &tcpFloor{ln: ln}
	t.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.track(c)
			t.wg.Go(func() {
				var buf [frameSize]byte
				for {
					if _, err := io.ReadFull(c, buf[:]); err != nil {
						return
					}
					if _, err := c.Write(buf[:]); err != nil {
						return
					}
				}
			})
		}
	})
	return t, nil
}

func (t *tcpFloor) track(c net.Conn) {
	t.mu.Lock()
	t.conns = append(t.conns, c)
	t.mu.Unlock()
}

func (t *tcpFloor) Ask(id int, loop func(ask func() error) error) error {
	c, err := net.Dial("tcp", t.ln.Addr().String())
	if err != nil {
		return err
	}
	t.track(c)
	var out, in [frameSize]byte
	var seq uint64
	return loop(func() error {
		seq++
		binary.LittleEndian.PutUint64(out[:], seq)
		if _, err := c.Write(out[:]); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, in[:]); err != nil {
			return err
		}
		if !bytes.Equal(in[:], out[:]) {
			return fmt.Errorf("echo of frame %d differs", seq)
		}
		return nil
	})
}

func (t *tcpFloor) Close() {
	t.ln.Close()
	t.mu.Lock()
	for _, c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
}

// freeLoopbackAddr returns a loopback address whose port was free a
// moment ago, for systems that need their listen address up front.
func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
