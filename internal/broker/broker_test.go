package broker

import (
	"log/slog"
	"testing"
	"time"
)

// TestBroker: a subscriber gets what is published after it subscribed, in
// order, even while it does not read; cancel closes its channel.
func TestBroker(t *testing.T) {
	var b Broker[int]
	b.Publish(0) // before anyone listens: for no one
	ch, cancel := b.Subscribe(slog.Default())
	for i := 1; i <= 1000; i++ {
		b.Publish(i) // never blocks, though nothing reads yet
	}
	for want := 1; want <= 1000; want++ {
		select {
		case got := <-ch:
			if got != want {
				t.Fatalf("got %d, want %d", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("message %d not delivered", want)
		}
	}
	cancel()
	if _, open := <-ch; open {
		t.Error("the channel is open after cancel")
	}
	cancel() // twice is fine
}
