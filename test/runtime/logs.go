package runtime

import (
	"bufio"
	"os"
	"strings"
	"testing"
	"time"
)

// LogLines reads a CRI log file ("<time> <stream> <tag> <line>") back as
// the lines the container printed, waiting up to 10 s for at least n.
func LogLines(t testing.TB, path string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var lines []string
		if f, err := os.Open(path); err == nil {
			s := bufio.NewScanner(f)
			for s.Scan() {
				if f := strings.SplitN(s.Text(), " ", 4); len(f) == 4 {
					lines = append(lines, f[3])
				}
			}
			f.Close()
		}
		if len(lines) >= n || time.Now().After(deadline) {
			return lines
		}
		time.Sleep(50 * time.Millisecond)
	}
}
