package logrotate_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cairn-os/cairn/agent/kubelet/logrotate"
	"github.com/cairn-os/cairn/agent/kubelet/pods"
	"github.com/cairn-os/cairn/test/poll"
	"github.com/cairn-os/cairn/test/registry"
	"github.com/cairn-os/cairn/test/runtime"
)

// TestRotate runs a container that writes 200 kB a second on a real
// containerd and rotates its log at 32 KiB keeping 3 files: the log goes
// on in a fresh file after each rotation, and only 2 rotated files stay.
func TestRotate(t *testing.T) {
	rt := runtime.Start(t)
	reg := registry.Start(t)
	if err := rt.AllowHTTP(reg.Addr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := registry.BuildAndPush(ctx, reg, "./agent/kubelet/logrotate/testdata/chatter", "cairn-test/chatter:v1"); err != nil {
		t.Fatal(err)
	}
	w, err := pods.New(pods.Config{Runtime: rt.RuntimeClient, Images: rt.ImageClient, LogRoot: filepath.Join(t.TempDir(), "pods")})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "chatter", Namespace: "default", UID: "uid-chatter"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "chatter", Image: reg.Addr + "/cairn-test/chatter:v1", ImagePullPolicy: corev1.PullIfNotPresent,
		}}},
	}
	var logPath string
	poll.Until(t, time.Minute, "chatter running", func() error {
		st, err := w.Sync(ctx, pod)
		if err != nil {
			return err
		}
		if st.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %s", st.Phase)
		}
		logPath = st.Containers[0].LogPath
		return nil
	})
	t.Cleanup(func() { w.Terminate(context.Background(), pod, time.Second) })

	r := &logrotate.Rotator{Runtime: rt.RuntimeClient, MaxSize: 32 << 10, MaxFiles: 3}
	for range 8 {
		time.Sleep(300 * time.Millisecond)
		if err := r.Rotate(ctx); err != nil {
			t.Fatalf("Rotate: %v", err)
		}
	}
	rotated, err := filepath.Glob(logPath + ".*")
	if err != nil {
		t.Fatal(err)
	}
	if len(rotated) != 2 {
		t.Fatalf("rotated files %q, want the newest 2", rotated)
	}
	// The runtime writes on in the fresh file, past the rotated lines.
	last := lastLine(t, rotated[1])
	poll.Until(t, 10*time.Second, "lines after the rotated ones in the current log", func() error {
		if n := lastLine(t, logPath); n <= last {
			return fmt.Errorf("last line %d, want one after %d", n, last)
		}
		return nil
	})
}

// lastLine is the number of the last complete "line N" in a CRI log file.
func lastLine(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := -1
	for _, l := range strings.Split(string(b), "\n") {
		// <time> stdout F line N xxx…
		f := strings.Fields(l)
		if len(f) >= 5 && f[3] == "line" {
			if v, err := strconv.Atoi(f[4]); err == nil {
				n = v
			}
		}
	}
	return n
}
