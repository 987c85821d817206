package stage2

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/beevik/ntp"
	"golang.org/x/sys/unix"

	"github.com/cairn-os/cairn/api/machine"
	"github.com/cairn-os/cairn/test/need"
	"github.com/cairn-os/cairn/test/poll"
)

// recordingClock records the corrections asked of it instead of making
// them: no test changes this machine's clock.
type recordingClock struct {
	mu           sync.Mutex
	steps, slews []time.Duration
}

func (c *recordingClock) step(d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.steps = append(c.steps, d)
	return nil
}

func (c *recordingClock) slew(d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slews = append(c.slews, d)
	return nil
}

func (c *recordingClock) counts() (steps, slews int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.steps), len(c.slews)
}

// freeUDPPort returns a loopback UDP port that nothing listens on.
func freeUDPPort(t *testing.T) int {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// chronyd runs Debian's chronyd as an NTP server on 127.0.0.1:port, its
// own clock the reference (local stratum 10), from a config in a new
// directory; -x keeps it from ever adjusting this machine's clock. It
// returns once the server answers, and a func that stops it (also run
// when the test ends).
func chronyd(t *testing.T, port int) (stop func()) {
	t.Helper()
	bin := need.Tool(t, "chronyd", "chrony")
	dir := t.TempDir()
	conf := filepath.Join(dir, "chrony.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(`port %d
bindaddress 127.0.0.1
allow 127.0.0.1
local stratum 10
cmdport 0
user root
pidfile %s
`, port, filepath.Join(dir, "chronyd.pid"))), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cmd := exec.Command(bin, "-x", "-d", "-f", conf)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
	}
	t.Cleanup(stop)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	poll.Until(t, 20*time.Second, "chronyd answers on "+addr, func() error {
		if cmd.ProcessState != nil {
			return fmt.Errorf("chronyd exited: %s", logs.String())
		}
		r, err := ntp.QueryWithOptions(addr, ntp.QueryOptions{Timeout: time.Second})
		if err == nil {
			err = r.Validate()
		}
		return err
	})
	return stop
}

// testKeeper is a time keeper of servers with a recording clock, whose
// queries see this machine's clock skew behind the servers'.
func testKeeper(servers []string, skew time.Duration) (*timeKeeper, *recordingClock) {
	c := &recordingClock{}
	k := newTimeKeeper(servers, c)
	k.query = func(server string) (*ntp.Response, error) {
		return ntp.QueryWithOptions(server, ntp.QueryOptions{
			Timeout:       time.Second,
			GetSystemTime: func() time.Time { return time.Now().Add(-skew) },
		})
	}
	return k, c
}

// TestTimeKeeperPoll polls a real NTP server on loopback after one that
// does not answer: the second corrects the clock, slewed when it is this
// machine's own and stepped when the clock is 5 s behind, and the state
// says so.
func TestTimeKeeperPoll(t *testing.T) {
	down := fmt.Sprintf("127.0.0.1:%d", freeUDPPort(t))
	port := freeUDPPort(t)
	chronyd(t, port)
	up := fmt.Sprintf("127.0.0.1:%d", port)

	for _, tt := range []struct {
		name                 string
		skew                 time.Duration
		wantSteps, wantSlews int
		minOffset, maxOffset time.Duration
	}{
		{name: "in step", skew: 0, wantSlews: 1, minOffset: -50 * time.Millisecond, maxOffset: 50 * time.Millisecond},
		{name: "5s behind", skew: 5 * time.Second, wantSteps: 1, minOffset: 4950 * time.Millisecond, maxOffset: 5050 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			k, c := testKeeper([]string{down, up}, tt.skew)
			before := time.Now()
			if err := k.poll(); err != nil {
				t.Fatalf("poll() = %v", err)
			}
			if steps, slews := c.counts(); steps != tt.wantSteps || slews != tt.wantSlews {
				t.Errorf("poll() made %d steps (%v) and %d slews (%v), want %d and %d", steps, c.steps, slews, c.slews, tt.wantSteps, tt.wantSlews)
			}
			s := k.timeSync()
			if !s.Synced || s.Server != up || s.Error != "" {
				t.Errorf("timeSync() = %v, want synced from %s without error", s, up)
			}
			if off := s.Offset.AsDuration(); off < tt.minOffset || off > tt.maxOffset {
				t.Errorf("timeSync().Offset = %v, want within [%v, %v]", off, tt.minOffset, tt.maxOffset)
			}
			if at := s.LastSync.AsTime(); at.Before(before) || at.After(time.Now()) {
				t.Errorf("timeSync().LastSync = %v, want during the poll (from %v)", at, before)
			}
		})
	}
}

// TestTimeKeeperUnreachable wants a poll of servers that all fail to leave
// the clock alone, with an error and a state that name each server.
func TestTimeKeeperUnreachable(t *testing.T) {
	a, b := fmt.Sprintf("127.0.0.1:%d", freeUDPPort(t)), "ntp.invalid"
	k, c := testKeeper([]string{a, b}, 0)
	err := k.poll()
	s := k.timeSync()
	for _, want := range []string{"NTP server " + a + ": ", "NTP server " + b + ": "} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("poll() = %v, want it to contain %q", err, want)
		}
		if !strings.Contains(s.Error, want) {
			t.Errorf("timeSync().Error = %q, want it to contain %q", s.Error, want)
		}
	}
	if s.Synced {
		t.Error("timeSync().Synced = true after a failed poll")
	}
	if steps, slews := c.counts(); steps+slews != 0 {
		t.Errorf("a failed poll corrected the clock (steps %v, slews %v)", c.steps, c.slews)
	}
}

// waitClock hands each wait of the keeper to the test, on waits, and ends
// it when the test sends on fire: the test sees the poll intervals
// without spending them, and changes what it likes between two polls.
type waitClock struct {
	waits chan time.Duration
	fire  chan time.Time
	stop  chan struct{}
}

func (waitClock) Now() time.Time { return time.Now() }

func (w waitClock) After(d time.Duration) <-chan time.Time {
	select {
	case w.waits <- d:
	case <-w.stop:
	}
	return w.fire
}

// TestTimeKeeperKeep runs the keeper against a real NTP server on
// loopback: the interval doubles from minPoll to maxPoll while the server
// answers; when it stops, the state says so and the keeper retries soon,
// backing off; when it answers again, the clock is in step again.
func TestTimeKeeperKeep(t *testing.T) {
	port := freeUDPPort(t)
	stopServer := chronyd(t, port)
	server := fmt.Sprintf("127.0.0.1:%d", port)
	k, c := testKeeper([]string{server}, 0)
	w := waitClock{waits: make(chan time.Duration), fire: make(chan time.Time), stop: make(chan struct{})}
	k.wait = w
	if err := k.poll(); err != nil {
		t.Fatalf("first poll() = %v", err)
	}
	done := make(chan struct{})
	go func() { defer close(done); k.keep(true, w.stop) }()
	defer func() { close(w.stop); <-done }()

	// wait takes the keeper's next wait, which is want (and up to 10%
	// more if jitter), without ending it.
	wait := func(want time.Duration, jitter bool) {
		t.Helper()
		got := <-w.waits
		hi := want
		if jitter {
			hi += want / 10
		}
		if got < want || got > hi {
			t.Errorf("keeper waits %v, want %v (jitter up to 10%%: %t)", got, want, jitter)
		}
	}
	fire := func() { w.fire <- time.Now() }
	for _, want := range []time.Duration{minPoll, 2 * minPoll, 4 * minPoll, 8 * minPoll, maxPoll} {
		wait(want, false)
		fire()
	}
	wait(maxPoll, false)
	if _, slews := c.counts(); slews != 6 {
		t.Errorf("the keeper slewed the clock %d times in 6 polls, want 6", slews)
	}

	stopServer()
	fire() // a poll that fails
	wait(2*time.Second, true)
	if s := k.timeSync(); s.Synced || !strings.Contains(s.Error, "NTP server "+server+": ") || s.Server != server || s.NextPoll == nil {
		t.Errorf("timeSync() with the server down = %v, want not synced, the error naming %s, the last sync's server and the next poll", s, server)
	}
	fire()
	wait(4*time.Second, true)

	chronyd(t, port)
	fire() // a poll that succeeds
	wait(maxPoll, false)
	if s := k.timeSync(); !s.Synced || s.Error != "" {
		t.Errorf("timeSync() with the server back = %v, want synced", s)
	}
}

// TestTimeKeeperServersChange changes the servers of a running keeper, as
// a config applied live does: from one that does not answer to a real
// server on loopback, polled at once and then every minPoll; then to
// none, when the keeper rests and reports no sync.
func TestTimeKeeperServersChange(t *testing.T) {
	down := fmt.Sprintf("127.0.0.1:%d", freeUDPPort(t))
	port := freeUDPPort(t)
	chronyd(t, port)
	server := fmt.Sprintf("127.0.0.1:%d", port)
	k, c := testKeeper([]string{down}, 0)
	w := waitClock{waits: make(chan time.Duration), fire: make(chan time.Time), stop: make(chan struct{})}
	k.wait = w
	done := make(chan struct{})
	go func() { defer close(done); k.keep(false, w.stop) }()
	defer func() { close(w.stop); <-done }()
	<-w.waits // retrying the server that does not answer

	k.setServers([]string{server})
	// Polled at once, not after the wait; then every minPoll.
	if got := <-w.waits; got != minPoll {
		t.Errorf("after the first poll of the new server the keeper waits %v, want minPoll", got)
	}
	if s := k.timeSync(); !s.GetSynced() || s.Server != server {
		t.Errorf("timeSync() after the change = %v, want synced from %s", s, server)
	}
	if _, slews := c.counts(); slews != 1 {
		t.Errorf("%d slews after the change, want 1", slews)
	}

	k.setServers(nil) // seen by the keeper waiting for its next poll
	select {
	case d := <-w.waits:
		t.Errorf("the keeper with no servers waits %v for a poll, want none", d)
	case <-time.After(200 * time.Millisecond):
	}
	if s := k.timeSync(); s != nil {
		t.Errorf("timeSync() with the servers removed = %v, want none", s)
	}
}

// TestTimeSyncControl reads the time keeper's state from the control
// socket, where the agent's Version gets it: none without NTP servers,
// the sync once a real server on loopback answered.
func TestTimeSyncControl(t *testing.T) {
	n := newNode(newFakeSystem().system(), nil)
	t.Cleanup(func() { close(n.stop) })
	if err := n.startTimeKeeper(nil); err != nil || n.timeKeeper.timeSync() != nil {
		t.Fatalf("startTimeKeeper(no servers) = %v and a sync %v, want none", err, n.timeKeeper.timeSync())
	}
	c := controlClient(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tl, err := c.BootTimeline(ctx, &machine.BootTimelineRequest{})
	if err != nil || tl.TimeSync != nil {
		t.Errorf("BootTimeline() without NTP servers = %v, %v; want no time sync", tl, err)
	}

	port := freeUDPPort(t)
	chronyd(t, port)
	server := fmt.Sprintf("127.0.0.1:%d", port)
	k, _ := testKeeper([]string{server}, 0)
	if err := k.poll(); err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	n.timeKeeper = k
	n.mu.Unlock()
	tl, err = c.BootTimeline(ctx, &machine.BootTimelineRequest{})
	if err != nil || !tl.TimeSync.GetSynced() || tl.TimeSync.GetServer() != server || tl.TimeSync.GetLastSync() == nil {
		t.Errorf("BootTimeline() = %v, %v; want the time synced from %s", tl, err, server)
	}
}

// TestNanoTimeval checks the offsets kernelClock.step gives adjtimex, which
// no test may call: a step back has negative seconds and positive
// nanoseconds.
func TestNanoTimeval(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want unix.Timeval
	}{
		{5*time.Second + 250*time.Millisecond, unix.Timeval{Sec: 5, Usec: 250e6}},
		{-5*time.Second - 250*time.Millisecond, unix.Timeval{Sec: -6, Usec: 750e6}},
		{-2 * time.Second, unix.Timeval{Sec: -2, Usec: 0}},
		{-time.Nanosecond, unix.Timeval{Sec: -1, Usec: 999999999}},
	} {
		if got := nanoTimeval(tt.d); got != tt.want {
			t.Errorf("nanoTimeval(%v) = %+v, want %+v", tt.d, got, tt.want)
		}
	}
}
