package boot

import (
	"fmt"
	"log/slog"
	"runtime/debug"
)

// Catch runs f and returns its error, or the panic it raised as an error:
// PID 1 must not die of a bug in one of its parts. The panic's stack goes
// to the log, named for what panicked.
func Catch(name string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			slog.Error("panic recovered", "in", name, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return f()
}

// Go runs f in a new goroutine that a panic cannot take PID 1 down with:
// the panic is logged (see Catch) and the goroutine ends. A panic in a
// goroutine of PID 1 started with a bare go statement kills the node.
func Go(name string, f func()) {
	go Catch(name, func() error { f(); return nil })
}
