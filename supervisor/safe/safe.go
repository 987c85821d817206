// Package safe runs code that must not take its process down with a panic:
// on a node that process is PID 1, and a panic in any of its goroutines
// would end the node. Every goroutine of init and of the supervisor is
// started with Go; code run in place (a boot step, a launcher, a probe) is
// run with Catch. It depends on the standard library only, so that init's
// stage 1 can use it and stay small.
package safe

import (
	"fmt"
	"log/slog"
	"runtime/debug"
)

// PanicError is a panic recovered by Catch.
type PanicError struct {
	In    string // what panicked, as named to Catch
	Value any    // what it panicked with
}

func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// Catch runs f and returns its error, or the panic it raised as a
// *PanicError. The panic's stack goes to log, named for what panicked.
func Catch(log *slog.Logger, name string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			log.Error("panic recovered", "in", name, "panic", r, "stack", string(debug.Stack()))
			err = &PanicError{In: name, Value: r}
		}
	}()
	return f()
}

// Go runs f in a new goroutine that a panic cannot take the process down
// with: the panic is logged (see Catch) and the goroutine ends.
func Go(log *slog.Logger, name string, f func()) {
	go Catch(log, name, func() error { f(); return nil })
}
