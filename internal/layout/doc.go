// Package layout holds no code: its test checks the module's package graph
// — every import points down the layers of README's Layout table, the
// library never imports test helpers or harnesses, and only bench/ imports
// bench/.
package layout
