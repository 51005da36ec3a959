// Package layout holds no code: its test checks the module's package graph
// — every import points down the layers of README's Layout table, the
// library never imports test helpers or harnesses, and only bench/ imports
// bench/ —, that no library source file is longer than 600 lines, that
// the runner's Runner type stays within its size and reacts to a shard's
// change in one place, and that examples/ builds the library's
// dependencies at the library's versions (so make test compiles them once
// for both modules).
package layout
