package boot

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRunSteps(t *testing.T) {
	var ran []string
	run := func(name string, err error) func() error {
		return func() error { ran = append(ran, name); return err }
	}
	var tl []Record
	err := RunSteps(&tl, []Step{
		{Name: "a", Run: run("a", nil)},
		{Name: "b", Run: run("b", errors.New("no link")), Fatal: false},
		{Name: "c", Run: run("c", errors.New("no root")), Fatal: true},
		{Name: "d", Run: run("d", nil)},
	})
	if err == nil || err.Error() != "c: no root" {
		t.Errorf("RunSteps() = %v, want the fatal step's error %q", err, "c: no root")
	}
	if diff := cmp.Diff([]string{"a", "b", "c"}, ran); diff != "" {
		t.Errorf("steps run (-want +got):\n%s", diff)
	}
	var got [][2]string
	for _, r := range tl {
		got = append(got, [2]string{r.Name, r.Err})
		if r.Start <= 0 || r.Duration < 0 {
			t.Errorf("record %q: start %s, duration %s; want times from the boot clock", r.Name, r.Start, r.Duration)
		}
	}
	want := [][2]string{{"a", ""}, {"b", "no link"}, {"c", "no root"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("timeline (-want +got):\n%s", diff)
	}
}

func TestInheritTimeline(t *testing.T) {
	want := []Record{{Name: "mount root squashfs", Start: 3e9, Duration: 2e7}}
	raw, _ := json.Marshal(want)
	t.Setenv(TimelineEnv, string(raw))
	got := InheritTimeline()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("InheritTimeline() (-want +got):\n%s", diff)
	}
	if v, ok := os.LookupEnv(TimelineEnv); ok {
		t.Errorf("%s = %q after InheritTimeline, want it unset so services do not inherit it", TimelineEnv, v)
	}
}

func TestConsoleHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewConsoleHandler(&buf)).With("step", "network")
	log.Info("link up", "link", "eth0")
	log.Warn("no lease", "link", "eth1")
	log.Debug("hidden")
	want := "cairn: link up step=network link=eth0\ncairn: WARN no lease step=network link=eth1\n"
	if got := buf.String(); got != want {
		t.Errorf("console output = %q, want %q", got, want)
	}
}

func TestRunStepsPanic(t *testing.T) {
	var tl []Record
	var m map[string]int
	err := RunSteps(&tl, []Step{
		{Name: "buggy", Run: func() error { m["x"] = 1; return nil }},
		{Name: "next", Run: func() error { return nil }},
	})
	if err != nil {
		t.Errorf("RunSteps() = %v, want nil: a step that panics is not fatal unless marked so", err)
	}
	if len(tl) != 2 || !strings.HasPrefix(tl[0].Err, "panic: assignment to entry in nil map") || tl[1].Err != "" {
		t.Errorf("timeline %+v, want the panic as the first step's error and the next step run", tl)
	}
	err = RunSteps(&tl, []Step{{Name: "root", Run: func() error { panic("no root") }, Fatal: true}})
	if err == nil || err.Error() != "root: panic: no root" {
		t.Errorf("RunSteps(fatal step panics) = %v, want %q", err, "root: panic: no root")
	}
}

func TestGo(t *testing.T) {
	done := make(chan struct{})
	Go("test", func() {
		defer close(done)
		panic("in a goroutine")
	})
	<-done // the test binary is still alive: the panic was recovered
}
