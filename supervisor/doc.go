// Package supervisor runs long-lived services and keeps them running: each
// service is started, restarted with exponential backoff when it exits, and
// stopped with a signal, a timeout and then SIGKILL.
//
// It knows nothing of Cairn. Processes are started through a Starter, so the
// same code works under PID 1, where one reaper collects every child
// (NewReaper), and in an ordinary process (DirectStarter).
package supervisor
