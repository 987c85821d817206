package supervisor

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestOOMScoreAdj raises a service's OOM score, which works without
// privilege, and lowers another's, which needs CAP_SYS_RESOURCE: without
// it the failure is logged and the service runs all the same.
func TestOOMScoreAdj(t *testing.T) {
	up, down := 500, -500
	var logs syncBuffer
	s := New(Options{Log: slog.New(slog.NewTextHandler(&logs, nil))})
	for _, svc := range []Service{
		{Name: "up", Path: "/bin/sleep", Args: []string{"60"}, OOMScoreAdj: &up},
		{Name: "down", Path: "/bin/sleep", Args: []string{"60"}, OOMScoreAdj: &down},
	} {
		if err := s.Add(svc); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)
	if got := oomScoreAdj(t, waitState(t, s, "up", StateReady).Pid); got != up {
		t.Errorf("oom_score_adj of up = %d, want %d", got, up)
	}
	got := oomScoreAdj(t, waitState(t, s, "down", StateReady).Pid)
	if got != down && !strings.Contains(logs.String(), "could not set OOM score adjustment") {
		t.Errorf("oom_score_adj of down = %d, want %d or a warning in the log:\n%s", got, down, logs.String())
	}
}

func oomScoreAdj(t *testing.T, pid int) int {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
