package host

import (
	"strings"
	"testing"
)

// TestReaders reads this machine.
func TestReaders(t *testing.T) {
	m, err := ReadMemory()
	if err != nil || m.Total == 0 || m.Available > m.Total {
		t.Errorf("ReadMemory() = %+v, %v; want 0 < Available <= Total", m, err)
	}
	fs, err := StatFS(t.TempDir())
	if err != nil || fs.Size == 0 || fs.Free > fs.Size {
		t.Errorf("StatFS() = %+v, %v; want 0 < Free <= Size", fs, err)
	}
	p, err := ReadPIDs()
	if err != nil || p.Used == 0 || p.Used > p.Max {
		t.Errorf("ReadPIDs() = %+v, %v; want 0 < Used <= Max", p, err)
	}
	if k, err := KernelVersion(); err != nil || k == "" || strings.ContainsRune(k, 0) {
		t.Errorf("KernelVersion() = %q, %v", k, err)
	}
	if s, err := OSImage(); err != nil || s == "" {
		t.Errorf("OSImage() = %q, %v", s, err)
	}
	if id, err := BootID(); err != nil || len(id) != 36 {
		t.Errorf("BootID() = %q, %v; want a UUID", id, err)
	}
	addrs, err := Addresses()
	if err != nil {
		t.Errorf("Addresses() = %v", err)
	}
	for _, a := range addrs {
		if !a.IsGlobalUnicast() {
			t.Errorf("Addresses() = %v: %v is not global unicast", addrs, a)
		}
	}
	t.Logf("memory %+v, filesystem %+v, pids %+v, addresses %v", m, fs, p, addrs)
}
