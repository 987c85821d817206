// Package broker hands every message published to every subscriber, in
// order, without ever blocking the publisher: each subscriber has a queue
// of its own, which grows while it reads slowly.
package broker

import (
	"log/slog"
	"sync"

	"github.com/cairn-os/cairn/supervisor/safe"
)

// Broker is the zero value ready to use.
type Broker[T any] struct {
	mu   sync.Mutex
	subs map[*subscriber[T]]struct{}
}

type subscriber[T any] struct {
	mu    sync.Mutex
	queue []T
	wake  chan struct{} // capacity 1: "the queue has grown"
	done  chan struct{}
	once  sync.Once
}

// Publish queues m for every subscriber.
func (b *Broker[T]) Publish(m T) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		s.mu.Lock()
		s.queue = append(s.queue, m)
		s.mu.Unlock()
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// Subscribe returns every message published from now on, in order, until
// cancel is called; then the channel is closed. log gets a panic of the
// goroutine that feeds it.
func (b *Broker[T]) Subscribe(log *slog.Logger) (<-chan T, func()) {
	s := &subscriber[T]{wake: make(chan struct{}, 1), done: make(chan struct{})}
	b.mu.Lock()
	if b.subs == nil {
		b.subs = make(map[*subscriber[T]]struct{})
	}
	b.subs[s] = struct{}{}
	b.mu.Unlock()
	out := make(chan T)
	safe.Go(log, "broker", func() {
		defer close(out)
		for {
			s.mu.Lock()
			queue := s.queue
			s.queue = nil
			s.mu.Unlock()
			for _, m := range queue {
				select {
				case out <- m:
				case <-s.done:
					return
				}
			}
			select {
			case <-s.wake:
			case <-s.done:
				return
			}
		}
	})
	cancel := func() {
		s.once.Do(func() {
			b.mu.Lock()
			delete(b.subs, s)
			b.mu.Unlock()
			close(s.done)
		})
	}
	return out, cancel
}
