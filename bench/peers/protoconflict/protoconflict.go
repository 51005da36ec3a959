// Package protoconflict lets protoactor-go and hollywood live in one
// binary: both register a protobuf file "actor.proto" with a message
// "actor.PID", and the protobuf runtime panics at the second registration
// unless GOLANG_PROTOBUF_REGISTRATION_CONFLICT says otherwise. The runtime
// reads that variable when the conflict happens, during the second
// package's initialization; this package sets it first.
//
// It is a module of its own, with an import path that sorts before
// "github.com/...", because Go initializes the packages whose imports are
// ready in the order of their import paths: a package of the peers module
// itself ("github.com/shardhost/...") would run after the actor systems'.
//
// The conflict is harmless here: each framework marshals its own PID type
// through its generated code; only a lookup of "actor.PID" by name in the
// global registry would find hollywood's type, and neither framework's
// remote path sends a bare PID as a message in these scenarios.
package protoconflict

import "os"

func init() {
	if os.Getenv("GOLANG_PROTOBUF_REGISTRATION_CONFLICT") == "" {
		os.Setenv("GOLANG_PROTOBUF_REGISTRATION_CONFLICT", "ignore")
	}
}
