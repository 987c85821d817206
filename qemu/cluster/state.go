package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cairn-os/cairn/internal/atomicfile"
)

// StateFile is the cluster's state, in its directory.
const StateFile = "state.json"

// Phases of a cluster.
const (
	PhaseStarting = "starting"
	PhaseReady    = "ready"
	// PhaseDegraded: the cluster runs, but a node did not come up: Error
	// says which and why.
	PhaseDegraded = "degraded"
	PhaseFailed   = "failed" // it could not start: Error says why
	PhaseStopped  = "stopped"
)

// State is what a running cluster's process writes about it, for status
// and destroy from other processes.
type State struct {
	Name  string `json:"name"`
	PID   int    `json:"pid"` // of the process that owns the VMs and the control plane
	Phase string `json:"phase"`
	Error string `json:"error,omitempty"`
	// ReadyAfter is how long the nodes took from the first boot to all
	// Ready.
	ReadyAfter string `json:"readyAfter,omitempty"`
	Netns      string `json:"netns"`
	// APIServer is the API server's address: its own control plane's
	// forwarded to the host's loopback, or the existing cluster's.
	APIServer string `json:"apiServer,omitempty"`
	// Registry is the cluster's image registry on the host's loopback,
	// where users push; the nodes pull the same images from NodeRegistry.
	Registry     string `json:"registry,omitempty"`
	NodeRegistry string `json:"nodeRegistry,omitempty"`
	Kubeconfig   string `json:"kubeconfig"`
	// DNS is the cluster DNS Service's address; DeployedDNS says the
	// cluster deployed it (CoreDNS), rather than found it.
	DNS          string      `json:"dns,omitempty"`
	DeployedDNS  bool        `json:"deployedDNS,omitempty"`
	ClientConfig string      `json:"clientConfig"` // cairn node's, with every node's endpoint
	Nodes        []NodeState `json:"nodes,omitempty"`
}

// NodeState is one node of a cluster.
type NodeState struct {
	Name    string `json:"name"`
	Address string `json:"address"` // on the cluster's network: its InternalIP
	API     string `json:"api"`     // its API, forwarded to the host's loopback
	// Forwarded, if set, is where the host's loopback forwards to the
	// node's Options.NodePort.
	Forwarded string `json:"forwarded,omitempty"`
	Dir       string `json:"dir"`
	Console   string `json:"console,omitempty"`
}

// Running reports whether the process that owns the cluster is alive.
func (s *State) Running() bool {
	return s.PID > 0 && syscall.Kill(s.PID, 0) == nil && s.Phase != PhaseStopped && s.Phase != PhaseFailed
}

func (c *Cluster) writeState() error {
	b, err := json.MarshalIndent(c.state, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(c.opts.Dir, StateFile), append(b, '\n'), 0o644)
}

// ReadState reads the state of the cluster whose directory is dir.
func ReadState(dir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no cluster in %s (cairn qemu cluster create makes one)", dir)
	}
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, StateFile), err)
	}
	return &s, nil
}

// Destroy stops the cluster whose directory is dir from another process:
// it signals the owner, which shuts everything down, and waits up to
// timeout for it to exit; then it removes what may be left (the network
// namespace) and the directory.
func Destroy(dir string, timeout time.Duration) error {
	s, err := ReadState(dir)
	if err != nil {
		return err
	}
	if s.Running() {
		if err := syscall.Kill(s.PID, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("signal the cluster's process %d: %w", s.PID, err)
		}
		deadline := time.Now().Add(timeout)
		for syscall.Kill(s.PID, 0) == nil {
			if time.Now().After(deadline) {
				return fmt.Errorf("the cluster's process %d still runs %s after SIGTERM", s.PID, timeout)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if err := removeNetns(s.Netns); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}
