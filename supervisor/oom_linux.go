package supervisor

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
)

// oomLauncher sets the OOM score adjustment of each run's main process
// right after it starts. Children forked later inherit it; one forked
// before may not. A failure is logged, not fatal: without CAP_SYS_RESOURCE
// the score can be raised but not lowered.
type oomLauncher struct {
	Launcher
	adj int
	log *slog.Logger
}

func (l oomLauncher) Launch(ctx context.Context, opts LaunchOptions) (Instance, error) {
	inst, err := l.Launcher.Launch(ctx, opts)
	if err != nil {
		return nil, err
	}
	if err := setOOMScoreAdj(inst.Pid(), l.adj); err != nil {
		l.log.Warn("could not set OOM score adjustment", "err", err)
	}
	return inst, nil
}

func setOOMScoreAdj(pid, adj int) error {
	path := fmt.Sprintf("/proc/%d/oom_score_adj", pid)
	if err := os.WriteFile(path, []byte(strconv.Itoa(adj)), 0o644); err != nil {
		return fmt.Errorf("set oom_score_adj of pid %d to %d: %w", pid, adj, err)
	}
	return nil
}
