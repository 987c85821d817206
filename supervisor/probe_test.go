package supervisor

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestProbes(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "ok.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	// A TCP port that nothing listens on: take one and close it.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
		case "/moved":
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		default:
			http.Error(w, "no", http.StatusServiceUnavailable)
		}
	}))
	defer web.Close()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name  string
		probe Probe
		ready bool
	}{
		{"unix socket accepting", UnixSocketProbe(sock), true},
		{"unix socket missing", UnixSocketProbe(filepath.Join(dir, "none.sock")), false},
		{"tcp accepting", TCPProbe(tl.Addr().String()), true},
		{"tcp refused", TCPProbe(closed.Addr().String()), false},
		{"http 200", HTTPProbe(web.URL + "/ok"), true},
		{"http 302", HTTPProbe(web.URL + "/moved"), true},
		{"http 503", HTTPProbe(web.URL + "/down"), false},
		{"exec exit 0", ExecProbe("/bin/true"), true},
		{"exec exit 1", ExecProbe("/bin/sh", "-c", "exit 1"), false},
		{"exec missing", ExecProbe("/nonexistent/binary"), false},
		{"exec too slow", ExecProbe("/bin/sleep", "10"), false},
		{"file exists", FileProbe(file), true},
		{"file missing", FileProbe(filepath.Join(dir, "none")), false},
	}
	for _, tt := range tests {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := tt.probe.Check(ctx, DirectStarter{})
		cancel()
		if (err == nil) != tt.ready {
			t.Errorf("%s: Check() = %v, want ready %v", tt.name, err, tt.ready)
		}
	}
}
