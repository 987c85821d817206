package controlplane

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/cairn-os/cairn/internal/inns"
)

// process is one control-plane binary, started and stopped as a unit, its
// stdout and stderr appended to one log file.
type process struct {
	name  string
	path  string
	args  []string
	log   string
	netns string // the network namespace it runs in, if not the caller's

	cmd    *exec.Cmd
	done   chan struct{} // closed when cmd has been waited for
	err    error         // cmd.Wait's result, set before done closes
	killed bool          // the last stop needed SIGKILL
}

func (p *process) start() error {
	if p.running() {
		return fmt.Errorf("start %s: already running", p.name)
	}
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	defer f.Close() // the child has its own copy
	fmt.Fprintf(f, "=== %s %s %q\n", time.Now().Format(time.RFC3339Nano), p.path, p.args)
	cmd := exec.Command(p.path, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = sysProcAttr()
	if p.netns != "" {
		err = inns.Do(p.netns, cmd.Start)
	} else {
		err = cmd.Start()
	}
	if err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd, p.done, p.err = cmd, make(chan struct{}), nil
	go func(done chan struct{}) {
		p.err = cmd.Wait()
		close(done)
	}(p.done)
	return nil
}

// running reports whether the process was started and has not exited.
func (p *process) running() bool {
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// exited returns a non-nil error describing the exit if the process has
// exited, for waits that should give up early.
func (p *process) exited() error {
	if p.done == nil {
		return fmt.Errorf("%s was not started", p.name)
	}
	select {
	case <-p.done:
		return fmt.Errorf("%s exited: %v (log: %s)", p.name, p.err, p.log)
	default:
		return nil
	}
}

// stop sends SIGTERM, then SIGKILL after grace, and waits until the process
// has been reaped. Stopping a stopped process does nothing.
func (p *process) stop(grace time.Duration) error {
	if !p.running() {
		return nil
	}
	p.killed = false
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	p.killed = true
	p.cmd.Process.Kill()
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("stop %s (pid %d): still running 10 s after SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

// pid returns the process id of the last start, or 0.
func (p *process) pid() int {
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// tail returns at most the last n lines of the log.
func (p *process) tail(n int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	b = bytes.TrimRight(b, "\n")
	i := len(b)
	for ; n > 0 && i > 0; n-- {
		i = bytes.LastIndexByte(b[:i], '\n')
		if i < 0 {
			i = 0
		}
	}
	return string(b[i:])
}

// freePorts returns n distinct TCP ports on 127.0.0.1 that were free a
// moment ago. All listeners are held open until every port is chosen, so
// the ports differ from each other.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
