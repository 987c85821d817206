//go:build !linux

package host

import "net/netip"

// ReadMemory returns ErrUnsupported.
func ReadMemory() (Memory, error) { return Memory{}, ErrUnsupported }

// StatFS returns ErrUnsupported.
func StatFS(string) (Filesystem, error) { return Filesystem{}, ErrUnsupported }

// ReadPIDs returns ErrUnsupported.
func ReadPIDs() (PIDs, error) { return PIDs{}, ErrUnsupported }

// KernelVersion returns ErrUnsupported.
func KernelVersion() (string, error) { return "", ErrUnsupported }

// OSImage returns ErrUnsupported.
func OSImage() (string, error) { return "", ErrUnsupported }

// MachineID returns ErrUnsupported.
func MachineID() (string, error) { return "", ErrUnsupported }

// BootID returns ErrUnsupported.
func BootID() (string, error) { return "", ErrUnsupported }

// Addresses returns ErrUnsupported.
func Addresses() ([]netip.Addr, error) { return nil, ErrUnsupported }
