// Package inns runs code in a named network namespace (one that
// `ip netns add` made, under /run/netns): the sockets it opens and the
// processes it starts live there, while the rest of the program stays in
// its own.
package inns

import (
	"context"
	"fmt"
	"net"
	"runtime"

	"github.com/vishvananda/netns"
)

// Do runs f on an OS thread in the network namespace name. The thread
// goes back to its own namespace afterwards; if it cannot, it is never
// used again (Go ends a thread that stays locked when its goroutine
// ends).
func Do(name string, f func() error) error {
	target, err := netns.GetFromName(name)
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", name, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		leave, err := Enter(target)
		if err != nil {
			errc <- fmt.Errorf("network namespace %s: %w", name, err)
			return
		}
		ferr := f()
		if err := leave(); err != nil {
			errc <- fmt.Errorf("network namespace %s: %w", name, err)
			return
		}
		errc <- ferr
	}()
	return <-errc
}

// Enter locks the calling goroutine to its thread and moves the thread
// into the network namespace h. leave moves it back and unlocks it; if it
// cannot, the thread stays locked, so that Go ends it with its goroutine,
// and the caller must not go on in that goroutine as if nothing happened.
func Enter(h netns.NsHandle) (leave func() error, err error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("own network namespace: %w", err)
	}
	if err := netns.Set(h); err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("enter: %w", err)
	}
	return func() error {
		defer orig.Close()
		if err := netns.Set(orig); err != nil {
			return fmt.Errorf("leave: %w", err)
		}
		runtime.UnlockOSThread()
		return nil
	}, nil
}

// Dialer returns a dial function whose connections are made from the
// network namespace name, for http.Transport and client-go's rest.Config.
// A connection once made works from any thread.
func Dialer(name string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := Do(name, func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}
