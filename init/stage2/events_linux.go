package stage2

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/init/internal/boot"
	"github.com/cairn-os/cairn/internal/broker"
	"github.com/cairn-os/cairn/supervisor"
)

// eventsKept is how many events init keeps for Events.
const eventsKept = 1000

// eventLog is what happened on the node, for the Events call: the last
// eventsKept events, and each new one for those who follow.
type eventLog struct {
	mu    sync.Mutex
	kept  []*machine.Event
	added broker.Broker[*machine.Event]
}

// add records an event that happens now.
func (l *eventLog) add(kind, subject, message string) {
	l.addAt(time.Now(), kind, subject, message)
}

func (l *eventLog) addAt(t time.Time, kind, subject, message string) {
	if l == nil {
		return // a node of a test that keeps none
	}
	e := &machine.Event{Time: timestamppb.New(t), Kind: kind, Subject: subject, Message: message}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.kept = append(l.kept, e)
	if n := len(l.kept) - eventsKept; n > 0 {
		l.kept = slices.Delete(l.kept, 0, n)
	}
	l.added.Publish(e)
}

// step records a boot or shutdown step once it ran, at the time it ended.
func (l *eventLog) step(r boot.Record) {
	msg := fmt.Sprintf("done in %s", r.Duration.Round(time.Millisecond))
	if r.Err != "" {
		msg = fmt.Sprintf("failed after %s: %s", r.Duration.Round(time.Millisecond), r.Err)
	}
	booted := time.Now().Add(-boot.SinceBoot())
	l.addAt(booted.Add(r.Start+r.Duration), "step", r.Name, msg)
}

// services records each state change of the supervisor's services from
// changes, its subscription.
func (l *eventLog) services(changes <-chan supervisor.Event) {
	for e := range changes {
		msg := string(e.State)
		if e.Reason != "" {
			msg += ": " + e.Reason
		}
		l.addAt(e.Time, "service", e.Service, msg)
	}
}

// stream sends the kept events (the last tail, 0 all), then, if follow,
// each new one until the caller goes.
func (l *eventLog) stream(req *machine.EventsRequest, stream grpc.ServerStreamingServer[machine.Event]) error {
	if l == nil {
		return status.Error(codes.Unavailable, "this init keeps no events")
	}
	l.mu.Lock()
	kept := slices.Clone(l.kept)
	var added <-chan *machine.Event
	cancel := func() {}
	if req.Follow {
		added, cancel = l.added.Subscribe(slog.Default())
	}
	l.mu.Unlock()
	defer cancel()
	if t := int(req.Tail); t > 0 && t < len(kept) {
		kept = kept[len(kept)-t:]
	}
	for _, e := range kept {
		if err := stream.Send(e); err != nil {
			return err
		}
	}
	if !req.Follow {
		return nil
	}
	for {
		select {
		case e := <-added:
			if err := stream.Send(e); err != nil {
				return err
			}
		case <-stream.Context().Done():
			return nil
		}
	}
}
