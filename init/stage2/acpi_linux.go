package stage2

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"log/slog"
	"time"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"

	"github.com/cairn-os/cairn/init/internal/boot"
)

// The kernel's ACPI events as generic netlink messages (drivers/acpi/event.c):
// family "acpi_event", multicast group "acpi_mc_group", command
// ACPI_GENL_CMD_EVENT with one attribute ACPI_GENL_ATTR_EVENT holding a
// struct acpi_genl_event. The ACPI button driver (button.ko) sends one for
// each press of the power button, class "button/power" — QEMU's
// system_powerdown, a hypervisor's "shut down", a real button.
const (
	acpiFamily     = "acpi_event"
	acpiGroup      = "acpi_mc_group"
	acpiCmdEvent   = 1
	acpiAttrEvent  = 1
	acpiPowerClass = "button/power"
)

// acpiEvent is a struct acpi_genl_event: device_class char[20], bus_id
// char[15], then (aligned) u32 type and u32 data.
type acpiEvent struct {
	Class, BusID string
	Type, Data   uint32
}

func (e acpiEvent) String() string {
	return fmt.Sprintf("%s %s %08x %08x", e.Class, e.BusID, e.Type, e.Data)
}

const acpiEventSize = 44

// parseACPIEvent decodes the attributes of one acpi_event message.
func parseACPIEvent(attrs []byte) (acpiEvent, error) {
	ad, err := netlink.NewAttributeDecoder(attrs)
	if err != nil {
		return acpiEvent{}, err
	}
	for ad.Next() {
		if ad.Type() != acpiAttrEvent {
			continue
		}
		b := ad.Bytes()
		if len(b) < acpiEventSize {
			return acpiEvent{}, fmt.Errorf("ACPI event of %d bytes, want %d", len(b), acpiEventSize)
		}
		return acpiEvent{
			Class: cString(b[0:20]),
			BusID: cString(b[20:35]),
			Type:  binary.NativeEndian.Uint32(b[36:40]),
			Data:  binary.NativeEndian.Uint32(b[40:44]),
		}, nil
	}
	if err := ad.Err(); err != nil {
		return acpiEvent{}, err
	}
	return acpiEvent{}, fmt.Errorf("ACPI message without an event attribute")
}

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// listenPowerButton joins the kernel's ACPI event group and calls press on
// each press of the power button, from a goroutine of its own, for the
// node's lifetime. The events need the ACPI button driver (button.ko,
// loaded with the system modules).
func listenPowerButton(press func(acpiEvent)) error {
	c, err := genetlink.Dial(nil)
	if err != nil {
		return fmt.Errorf("generic netlink: %w", err)
	}
	f, err := c.GetFamily(acpiFamily)
	if err != nil {
		c.Close()
		return fmt.Errorf("generic netlink family %s (is the kernel built with ACPI?): %w", acpiFamily, err)
	}
	var group uint32
	for _, g := range f.Groups {
		if g.Name == acpiGroup {
			group = g.ID
		}
	}
	if group == 0 {
		c.Close()
		return fmt.Errorf("generic netlink family %s has no group %s", acpiFamily, acpiGroup)
	}
	if err := c.JoinGroup(group); err != nil {
		c.Close()
		return fmt.Errorf("join %s/%s: %w", acpiFamily, acpiGroup, err)
	}
	boot.Go("ACPI events", func() {
		defer c.Close()
		for {
			msgs, _, err := c.Receive()
			if err != nil {
				// ENOBUFS (events lost to a full buffer) and the like:
				// keep listening, without spinning.
				slog.Warn("ACPI events: receive failed", "err", err)
				time.Sleep(time.Second)
				continue
			}
			for _, m := range msgs {
				if m.Header.Command != acpiCmdEvent {
					continue
				}
				ev, err := parseACPIEvent(m.Data)
				if err != nil {
					slog.Warn("ACPI events: bad message", "err", err)
					continue
				}
				slog.Info("ACPI event", "event", ev.String())
				if ev.Class == acpiPowerClass {
					press(ev)
				}
			}
		}
	})
	return nil
}
