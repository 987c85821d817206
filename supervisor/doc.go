// Package supervisor runs long-lived services on a Linux node and keeps them
// running.
//
// A Service is a command (or anything a Launcher can start) with
// dependencies, a readiness Probe, actions run each time it becomes Ready
// (OnReady), a restart policy with exponential backoff,
// a stop signal and timeout, its own cgroup v2 with resource limits, an OOM
// score adjustment, and logs kept in memory and in size-rotated files. A
// Supervisor starts services in dependency order, each only once every
// dependency is Ready, stops them in reverse order, and publishes every state
// change on an event stream.
//
// Behaviour is added by wrapping: the restart policy and readiness probing
// drive any Launcher, cgroup placement and the OOM score wrap the launcher of
// each service, so a service run by another runtime (an OCI image through
// containerd, say) gets the same treatment as a plain process.
//
// The package knows nothing of Cairn. Processes are started through a
// Starter, so the same code works under PID 1, where one Reaper collects
// every child, and in an ordinary process (DirectStarter).
package supervisor
