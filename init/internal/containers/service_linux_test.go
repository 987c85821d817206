package containers

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cairn-os/cairn/machineconfig"
	"github.com/cairn-os/cairn/supervisor"
	"github.com/cairn-os/cairn/test/need"
	"github.com/cairn-os/cairn/test/registry"
	"github.com/cairn-os/cairn/test/runtime"
)

// TestRunOutlivesContainerd runs hello through the Launcher on a real
// containerd and kills containerd under it, twice. The first time the run
// goes on: no exit is reported, its output still comes. The second time
// hello is stopped while containerd is away: the run's end is reported
// once containerd is back, which has removed the task (its exit status is
// lost), so as a failure the supervisor restarts.
func TestRunOutlivesContainerd(t *testing.T) {
	need.Root(t, "containerd")
	rt := runtime.Start(t)
	reg := registry.Start(t)
	ctx := context.Background()
	if _, err := registry.BuildAndPush(ctx, reg, "./test/images/hello", "cairn-test/hello:v1"); err != nil {
		t.Fatal(err)
	}
	host := fmt.Sprintf("127.0.0.1:%d", reg.Port())
	if err := rt.AllowHTTP(host); err != nil {
		t.Fatal(err)
	}
	var out lines
	l := &Launcher{
		Socket: rt.Socket, HostsDir: filepath.Join(rt.Dir, "certs.d"),
		Service: machineconfig.Service{Name: fmt.Sprintf("hello-%d", os.Getpid()), Image: host + "/cairn-test/hello:v1"},
	}
	inst, err := l.Launch(ctx, supervisor.LaunchOptions{Output: &out})
	if err != nil {
		t.Fatal(err)
	}
	exited := false
	t.Cleanup(func() {
		if !exited {
			inst.Kill()
			<-inst.Exited()
		}
	})
	out.waitFor(t, "hello from", 30*time.Second)
	pid := inst.Pid()

	rt.Restart()
	// hello ticks every 5 s: a tick after the restart comes from the same
	// run, which must not have been reported as ended.
	ticks := strings.Count(out.String(), "tick ")
	deadline := time.After(15 * time.Second)
	for strings.Count(out.String(), "tick ") == ticks {
		select {
		case e := <-inst.Exited():
			exited = true
			t.Fatalf("the run ended when containerd restarted: %v; output:\n%s", e, out.String())
		case <-deadline:
			t.Fatalf("no tick from hello 15s after containerd restarted; output:\n%s", out.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	if inst.Pid() != pid {
		t.Errorf("Pid() = %d after the restart, want %d", inst.Pid(), pid)
	}

	rt.Stop()
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, "bye", 10*time.Second)
	// Three more questions to the absent containerd, and no exit heard.
	asked, giveUp := inst.(*instance).asked.Load(), time.After(10*time.Second)
	for inst.(*instance).asked.Load() < asked+3 {
		select {
		case e := <-inst.Exited():
			exited = true
			t.Fatalf("the run reported %v while containerd was away, want to hear only once it is back", e)
		case <-giveUp:
			t.Fatal("containerd not asked again about the task 10s after it went away")
		case <-time.After(50 * time.Millisecond):
		}
	}
	rt.StartAgain()
	select {
	case e := <-inst.Exited():
		exited = true
		if !e.Failed() || !strings.Contains(e.String(), "ended while containerd was away") {
			t.Errorf("Exited() = %v, want a failure saying the task ended while containerd was away", e)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit reported 30s after containerd came back")
	}
}

// lines collects a run's output.
type lines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *lines) waitFor(t *testing.T, s string, timeout time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !strings.Contains(l.String(), s); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the output after %s:\n%s", s, timeout, l.String())
		}
	}
}
