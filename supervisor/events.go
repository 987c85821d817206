package supervisor

import "time"

// Event is one state change of a service.
type Event struct {
	Service string
	State   State
	Time    time.Time
	// Reason says why, when there is more to say than the state: an exit
	// status, a start error, what the service waits for.
	Reason string
}
