package stage2

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestConfigSourceFrom(t *testing.T) {
	got := configSourceFrom("console=ttyS0 cairn.config.url=http://10.0.2.2:8080/m.yaml quiet cairn.config.sha256=ABCDEF\n")
	if want := (configSource{url: "http://10.0.2.2:8080/m.yaml", sha256: "abcdef"}); got != want {
		t.Errorf("configSourceFrom = %+v, want %+v", got, want)
	}
	if got := configSourceFrom("console=ttyS0 quiet"); got != (configSource{}) {
		t.Errorf("configSourceFrom without the arguments = %+v, want none", got)
	}
	digest := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		src  configSource
		want string // "" for accepted
	}{
		{configSource{url: "https://config.example/m.yaml"}, ""},
		{configSource{url: "http://10.0.2.2/m.yaml", sha256: digest}, ""},
		{configSource{url: "http://10.0.2.2/m.yaml"}, "plain HTTP: give the config's digest"},
		{configSource{url: "ftp://10.0.2.2/m.yaml", sha256: digest}, "want an http or https URL"},
		{configSource{url: "https://config.example/m.yaml", sha256: "abc"}, "64 hex digits"},
	} {
		err := tc.src.check()
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v.check() = %v, want %q", tc.src, err, tc.want)
		}
	}
}

// TestFetchFirstBootConfig serves configs over HTTP on loopback and wants
// a valid one of the right digest written to STATE, after the server's
// failures while it comes up; one of another digest or invalid refused at
// once and written nowhere; and nothing fetched when STATE has a config.
func TestFetchFirstBootConfig(t *testing.T) {
	valid, invalid := firstConfigs(t, "from-url")
	digest := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

	var requests, failFirst atomic.Int32
	var body atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if requests.Add(1) <= failFirst.Load() {
			http.Error(w, "not yet", http.StatusServiceUnavailable)
			return
		}
		w.Write(body.Load().([]byte))
	}))
	defer srv.Close()
	run := func(serve []byte, sha string, stateHas []byte, wait time.Duration) (bool, string, string, error) {
		body.Store(serve)
		requests.Store(0)
		dir := t.TempDir()
		state, firstBoot := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "first-boot.yaml")
		if stateHas != nil {
			if err := os.WriteFile(state, stateHas, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		fetched, err := fetchFirstBootConfig(context.Background(), configSource{url: srv.URL + "/m.yaml", sha256: sha}, state, firstBoot, wait)
		read := func(p string) string { b, _ := os.ReadFile(p); return string(b) }
		return fetched, read(state), read(firstBoot), err
	}

	failFirst.Store(2)
	fetched, state, firstBoot, err := run(valid, digest(valid), nil, time.Minute)
	if !fetched || err != nil || state != string(valid) || firstBoot != string(valid) {
		t.Errorf("fetch of a valid config = %v, %v; STATE %d bytes, first boot %d; want both the config", fetched, err, len(state), len(firstBoot))
	}
	if n := requests.Load(); n != 3 {
		t.Errorf("%d requests, want 3: two refused while the server came up", n)
	}
	failFirst.Store(0)

	for _, tc := range []struct {
		name  string
		serve []byte
		sha   string
		want  string
	}{
		{"another digest", valid, digest(invalid), "has the SHA-256 " + digest(valid)},
		{"invalid config", invalid, digest(invalid), "machine.hostname"},
	} {
		fetched, state, firstBoot, err := run(tc.serve, tc.sha, nil, time.Minute)
		if fetched || !errors.Is(err, errRefused) || !strings.Contains(err.Error(), tc.want) || state != "" || firstBoot != "" {
			t.Errorf("%s: fetched %v, error %v; want refused at once saying %q, nothing written", tc.name, fetched, err, tc.want)
		}
		if n := requests.Load(); n != 1 {
			t.Errorf("%s: %d requests, want 1", tc.name, n)
		}
	}

	if fetched, state, _, err := run(valid, digest(valid), []byte("kept"), time.Minute); fetched || err != nil || state != "kept" || requests.Load() != 0 {
		t.Errorf("with a config on STATE: fetched %v, %v, STATE %q, %d requests; want nothing done", fetched, err, state, requests.Load())
	}

	failFirst.Store(1 << 30)
	if fetched, state, _, err := run(valid, digest(valid), nil, 3*time.Second); fetched || err == nil || !strings.Contains(err.Error(), "no config after 3s") || state != "" {
		t.Errorf("a server that never answers: fetched %v, %v, STATE %q; want an error after the wait", fetched, err, state)
	}
}
