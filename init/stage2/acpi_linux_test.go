package stage2

import (
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/mdlayher/netlink"

	"github.com/cairn-os/cairn/test/need"
)

// acpiMessage encodes an acpi_event message's attributes as the kernel
// does (drivers/acpi/event.c), here for QEMU's power button.
func acpiMessage(t *testing.T, class, busID string, typ, data uint32) []byte {
	t.Helper()
	ev := make([]byte, acpiEventSize)
	copy(ev[0:20], class)
	copy(ev[20:35], busID)
	binary.NativeEndian.PutUint32(ev[36:40], typ)
	binary.NativeEndian.PutUint32(ev[40:44], data)
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(acpiAttrEvent, ev)
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseACPIEvent(t *testing.T) {
	got, err := parseACPIEvent(acpiMessage(t, "button/power", "LNXPWRBN:00", 0x80, 1))
	want := acpiEvent{Class: "button/power", BusID: "LNXPWRBN:00", Type: 0x80, Data: 1}
	if err != nil || got != want {
		t.Errorf("parseACPIEvent(power button) = %+v, %v; want %+v", got, err, want)
	}
	if s := got.String(); s != "button/power LNXPWRBN:00 00000080 00000001" {
		t.Errorf("acpiEvent.String() = %q, want acpid's format", s)
	}
	// A class that fills its field has no NUL.
	got, err = parseACPIEvent(acpiMessage(t, "abcdefghijklmnopqrst", "PNP0C0C:00", 0x80, 2))
	if err != nil || got.Class != "abcdefghijklmnopqrst" || got.BusID != "PNP0C0C:00" {
		t.Errorf("parseACPIEvent(full class) = %+v, %v", got, err)
	}
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(acpiAttrEvent, []byte("short"))
	short, _ := ae.Encode()
	if _, err := parseACPIEvent(short); err == nil || !strings.Contains(err.Error(), "5 bytes") {
		t.Errorf("parseACPIEvent(5 bytes) error = %v, want it to say the event is short", err)
	}
	if _, err := parseACPIEvent(nil); err == nil {
		t.Error("parseACPIEvent(no attributes) succeeded, want an error")
	}
}

// TestListenPowerButton joins the host kernel's ACPI event group, as init
// does on a node (no event is sent: that needs a machine's button).
func TestListenPowerButton(t *testing.T) {
	if _, err := os.Stat("/sys/firmware/acpi"); errors.Is(err, os.ErrNotExist) {
		need.Missing(t, "needs a host kernel with ACPI")
	}
	if err := listenPowerButton(func(acpiEvent) {}); err != nil {
		t.Fatalf("listenPowerButton() = %v", err)
	}
}
