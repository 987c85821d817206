package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/supervisor/safe"
)

// processLauncher starts a plain process through a Starter, in its own
// process group.
type processLauncher struct {
	starter Starter
	path    string
	args    []string
	env     []string
	dir     string
	log     *slog.Logger
}

func (l processLauncher) Launch(ctx context.Context, opts LaunchOptions) (Instance, error) {
	cmd := exec.Command(l.path, l.args...)
	cmd.Env = l.env
	cmd.Dir = l.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if opts.Cgroup != "" {
		// Start the process inside its cgroup (clone3 CLONE_INTO_CGROUP), so
		// no child it forks at once is left outside.
		cg, err := os.Open(opts.Cgroup)
		if err != nil {
			return nil, fmt.Errorf("open cgroup: %w", err)
		}
		defer cg.Close()
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(cg.Fd())
	}
	if opts.Output != nil {
		// A real pipe rather than an io.Writer: exec.Cmd would otherwise
		// tie its copying to Wait, which a reaping PID 1 never calls.
		pr, pw, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("output pipe: %w", err)
		}
		defer pw.Close()
		cmd.Stdout, cmd.Stderr = pw, pw
		safe.Go(l.log, "copy output", func() {
			io.Copy(opts.Output, pr)
			pr.Close()
		})
	}
	exits, err := l.starter.Start(cmd)
	if err != nil {
		return nil, err
	}
	return process{pid: cmd.Process.Pid, exits: exits}, nil
}

type process struct {
	pid   int
	exits <-chan Exit
}

func (p process) Pid() int            { return p.pid }
func (p process) Exited() <-chan Exit { return p.exits }

func (p process) Signal(sig syscall.Signal) error {
	return ignoreESRCH(unix.Kill(p.pid, sig))
}

// Kill ends the whole process group.
func (p process) Kill() error {
	return ignoreESRCH(unix.Kill(-p.pid, unix.SIGKILL))
}

func ignoreESRCH(err error) error {
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}
