package api

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/internal/crilog"
	"github.com/cairn-os/cairn/machineconfig"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestPodLogs reads CRI log files laid out as on a node through the API,
// with the least role that may.
func TestPodLogs(t *testing.T) {
	root := t.TempDir()
	pod := crilog.PodDir(root, "default", "web", "6f1f3c9e-0b0a-4d8e-9a55-0d2d5b8f5c11")
	logPath := filepath.Join(pod, crilog.ContainerLog("app", 1))
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	for _, l := range []string{"stdout F one", "stderr P tw", "stderr F o", "stdout F three"} {
		log.WriteString("2026-01-02T15:04:05.123456789Z " + l + "\n")
	}
	if err := os.WriteFile(logPath, []byte(log.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	b, endpoint := serve(t, &recordingInit{}, root)
	c := clientWithRole(t, b, endpoint, machineconfig.RoleReader)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	read := func(req *machine.PodLogsRequest) (string, error) {
		stream, err := c.PodLogs(ctx, req)
		if err != nil {
			return "", err
		}
		var out strings.Builder
		for {
			chunk, err := stream.Recv()
			if err == io.EOF {
				return out.String(), nil
			}
			if err != nil {
				return out.String(), err
			}
			out.Write(chunk.Data)
		}
	}
	for _, tt := range []struct {
		req      *machine.PodLogsRequest
		want     string
		wantCode codes.Code
	}{
		{req: &machine.PodLogsRequest{Namespace: "default", Pod: "web", Container: "app"}, want: "one\ntwo\nthree\n"},
		{req: &machine.PodLogsRequest{Namespace: "default", Pod: "web", TailLines: 2}, want: "two\nthree\n"},
		{req: &machine.PodLogsRequest{Namespace: "default", Pod: "web", Container: "db"}, wantCode: codes.NotFound},
		{req: &machine.PodLogsRequest{Namespace: "default", Pod: "nope"}, wantCode: codes.NotFound},
		{req: &machine.PodLogsRequest{Namespace: "../etc", Pod: "web"}, wantCode: codes.InvalidArgument},
	} {
		got, err := read(tt.req)
		if status.Code(err) != tt.wantCode || got != tt.want {
			t.Errorf("PodLogs(%v) = %q, %v; want %q, %v", tt.req, got, err, tt.want, tt.wantCode)
		}
	}

	t.Run("Follow", func(t *testing.T) {
		stream, err := c.PodLogs(ctx, &machine.PodLogsRequest{Namespace: "default", Pod: "web", TailLines: 1, Follow: true})
		if err != nil {
			t.Fatal(err)
		}
		recv := func() string {
			chunk, err := stream.Recv()
			if err != nil {
				t.Fatalf("Recv() = %v", err)
			}
			return string(chunk.Data)
		}
		if got := recv(); got != "three\n" {
			t.Errorf("first chunk = %q, want the last line", got)
		}
		f, err := os.OpenFile(logPath, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("2026-01-02T15:04:06Z stdout F four\n")
		f.Close()
		if got := recv(); got != "four\n" {
			t.Errorf("followed chunk = %q, want the new line", got)
		}
		// Rotated: the stream goes on with the new file.
		if err := os.Rename(logPath, logPath+".20260102-150407"); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(logPath, []byte("2026-01-02T15:04:08Z stdout F five\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := recv(); got != "five\n" {
			t.Errorf("chunk after a rotation = %q, want the new file's line", got)
		}
		// The log goes with its pod: the stream ends.
		if err := os.RemoveAll(pod); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != io.EOF {
			t.Errorf("Recv() after the log was removed = %v, want io.EOF", err)
		}
	})
}
