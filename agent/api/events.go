package api

import (
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc"

	"github.com/cairn-os/cairn/api/machine"
)

// Events streams init's events with the agent's audit records as events
// of kind audit, for a caller who may read the audit (an operator): the
// kept ones of each source (the last tail of each), then, if follow, new
// ones of both as they come. Each source's events are in order; the kept
// ones are merged by time.
func (s *machineServer) Events(req *machine.EventsRequest, stream grpc.ServerStreamingServer[machine.Event]) error {
	var (
		kept   []*machine.AuditRecord
		added  <-chan *machine.AuditRecord
		cancel = func() {}
	)
	if callerMay(stream.Context(), "Audit") {
		kept, added, cancel = s.audit.follow(int(req.Tail))
	}
	defer cancel()
	from, err := s.init.Events(stream.Context(), req)
	if err != nil {
		return err
	}
	audit := make([]*machine.Event, len(kept))
	for i, r := range kept {
		audit[i] = auditEvent(r)
	}
	if !req.Follow {
		var events []*machine.Event
		for {
			e, err := from.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			events = append(events, e)
		}
		for _, e := range mergeByTime(events, audit) {
			if err := stream.Send(e); err != nil {
				return err
			}
		}
		return nil
	}
	var mu sync.Mutex // one Send at a time
	send := func(e *machine.Event) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(e)
	}
	for _, e := range audit {
		if err := send(e); err != nil {
			return err
		}
	}
	errc := make(chan error, 2) // each goroutine's end, never blocking it
	if added != nil {
		go func() {
			for r := range added {
				if err := send(auditEvent(r)); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	go func() {
		for {
			e, err := from.Recv()
			if err == nil {
				err = send(e)
			}
			if err != nil {
				errc <- err
				return
			}
		}
	}()
	select {
	case err := <-errc:
		if err == io.EOF {
			return nil // init ended the stream: it is going down
		}
		return err
	case <-stream.Context().Done():
		return nil
	}
}

// auditEvent is an audit record as an event.
func auditEvent(r *machine.AuditRecord) *machine.Event {
	msg := fmt.Sprintf("%s (%s) from %s: %s", r.Caller, r.Role, r.Peer, r.Code)
	if r.Error != "" {
		msg += ": " + r.Error
	}
	return &machine.Event{Time: r.Time, Kind: "audit", Subject: r.Method, Message: msg}
}

// mergeByTime merges two lists in order of time into one, in order.
func mergeByTime(a, b []*machine.Event) []*machine.Event {
	out := make([]*machine.Event, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if b[0].Time.AsTime().Before(a[0].Time.AsTime()) {
			out, b = append(out, b[0]), b[1:]
		} else {
			out, a = append(out, a[0]), a[1:]
		}
	}
	return append(append(out, a...), b...)
}
