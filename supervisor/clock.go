package supervisor

import "github.com/cairn-os/cairn/internal/backoff"

// Clock is the supervisor's source of time, replaceable so tests can drive
// backoff and timeouts: Now, and After(d), a channel that receives the time
// once d has passed. It is the Clock of Cairn's retry delays.
type Clock = backoff.Clock
