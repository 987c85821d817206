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

func TestSequenceRun(t *testing.T) {
	var ran []string
	run := func(name string, err error) func() error {
		return func() error { ran = append(ran, name); return err }
	}
	tl := NewTimeline(nil)
	err := Sequence{Name: "test", Steps: []Step{
		{Name: "a", Run: run("a", nil)},
		{Name: "b", Run: run("b", errors.New("no link")), Fatal: false},
		{Name: "c", Run: run("c", errors.New("no root")), Fatal: true},
		{Name: "d", Run: run("d", nil)},
	}}.Run(tl, nil)
	if err == nil || err.Error() != "c: no root" {
		t.Errorf("Run() = %v, want the fatal step's error %q", err, "c: no root")
	}
	if diff := cmp.Diff([]string{"a", "b", "c"}, ran); diff != "" {
		t.Errorf("steps run (-want +got):\n%s", diff)
	}
	var got [][2]string
	for _, r := range tl.Records() {
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

// TestSequenceStop: a sequence told to stop ends before its next step;
// the step running meanwhile runs to its end.
func TestSequenceStop(t *testing.T) {
	stop := make(chan struct{})
	var ran []string
	tl := NewTimeline(nil)
	err := Sequence{Name: "boot", Steps: []Step{
		{Name: "running", Run: func() error { close(stop); ran = append(ran, "running"); return nil }},
		{Name: "next", Run: func() error { ran = append(ran, "next"); return nil }},
	}}.Run(tl, stop)
	if !errors.Is(err, ErrStopped) {
		t.Errorf("Run() = %v, want ErrStopped", err)
	}
	if diff := cmp.Diff([]string{"running"}, ran); diff != "" {
		t.Errorf("steps run (-want +got):\n%s", diff)
	}
	if recs := tl.Records(); len(recs) != 1 || recs[0].Name != "running" {
		t.Errorf("timeline %+v, want the step that ran only", recs)
	}
}

// TestTimelineReadDuringStep: the timeline answers while a step waits (a
// DHCP exchange, say), and work recorded beside the sequence takes its
// place by start time.
func TestTimelineReadDuringStep(t *testing.T) {
	tl := NewTimeline([]Record{{Name: "stage 1", Start: 1}})
	inStep, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Sequence{Name: "boot", Steps: []Step{
			{Name: "first", Run: func() error { return nil }},
			{Name: "waits", Run: func() error { close(inStep); <-release; return nil }},
		}}.Run(tl, nil)
	}()
	<-inStep
	recs := tl.Records()
	if len(recs) != 2 || recs[1].Name != "first" {
		t.Errorf("Records() during a step = %+v, want stage 1 and the step done", recs)
	}
	tl.Add(Record{Name: "beside", Start: recs[1].Start + 1})
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range tl.Records() {
		names = append(names, r.Name)
	}
	if diff := cmp.Diff([]string{"stage 1", "first", "beside", "waits"}, names); diff != "" {
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

func TestSequencePanic(t *testing.T) {
	tl := NewTimeline(nil)
	var m map[string]int
	err := Sequence{Name: "test", Steps: []Step{
		{Name: "buggy", Run: func() error { m["x"] = 1; return nil }},
		{Name: "next", Run: func() error { return nil }},
	}}.Run(tl, nil)
	if err != nil {
		t.Errorf("Run() = %v, want nil: a step that panics is not fatal unless marked so", err)
	}
	if recs := tl.Records(); len(recs) != 2 || !strings.HasPrefix(recs[0].Err, "panic: assignment to entry in nil map") || recs[1].Err != "" {
		t.Errorf("timeline %+v, want the panic as the first step's error and the next step run", recs)
	}
	err = Sequence{Name: "test", Steps: []Step{{Name: "root", Run: func() error { panic("no root") }, Fatal: true}}}.Run(tl, nil)
	if err == nil || err.Error() != "root: panic: no root" {
		t.Errorf("Run(fatal step panics) = %v, want %q", err, "root: panic: no root")
	}
}
