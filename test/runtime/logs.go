package runtime

import (
	"os"
	"testing"
	"time"

	"github.com/cairn-os/cairn/internal/crilog"
)

// LogLines reads a CRI log file back as the lines the container printed,
// waiting up to 10 s for at least n.
func LogLines(t testing.TB, path string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var lines []string
		if f, err := os.Open(path); err == nil {
			entries, _, err := crilog.Tail(f, 0)
			f.Close()
			if err != nil {
				t.Fatalf("read %s: %v", path, err)
			}
			for _, e := range entries {
				lines = append(lines, string(e.Line))
			}
		}
		if len(lines) >= n || time.Now().After(deadline) {
			return lines
		}
		time.Sleep(50 * time.Millisecond)
	}
}
