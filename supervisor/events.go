package supervisor

import (
	"log/slog"
	"sync"
	"time"

	"github.com/cairn-os/cairn/supervisor/safe"
)

// Event is one state change of a service.
type Event struct {
	Service string
	State   State
	Time    time.Time
	// Reason says why, when there is more to say than the state: an exit
	// status, a start error, what the service waits for.
	Reason string
}

// broker hands every event to every subscriber, in order, without ever
// blocking the publisher: each subscriber has its own queue.
type broker struct {
	mu   sync.Mutex
	subs map[*subscriber]struct{}
}

type subscriber struct {
	mu    sync.Mutex
	queue []Event
	wake  chan struct{} // capacity 1: "the queue has grown"
	done  chan struct{}
	once  sync.Once
}

func (b *broker) publish(e Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		s.mu.Lock()
		s.queue = append(s.queue, e)
		s.mu.Unlock()
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

func (b *broker) subscribe(log *slog.Logger) (<-chan Event, func()) {
	s := &subscriber{wake: make(chan struct{}, 1), done: make(chan struct{})}
	b.mu.Lock()
	if b.subs == nil {
		b.subs = make(map[*subscriber]struct{})
	}
	b.subs[s] = struct{}{}
	b.mu.Unlock()
	out := make(chan Event)
	safe.Go(log, "events", func() {
		defer close(out)
		for {
			s.mu.Lock()
			queue := s.queue
			s.queue = nil
			s.mu.Unlock()
			for _, e := range queue {
				select {
				case out <- e:
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
