// Package machine holds the protobuf messages and gRPC services of a Cairn
// node: Machine, the management API served by cairn-agent over mutual TLS,
// and Init, the control API that PID 1 serves to the agent on a unix socket.
//
// Regenerate with `make proto`.
package machine
