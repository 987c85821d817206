package stage2

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// sysBlock is where the kernel lists block devices and their partitions.
const sysBlock = "/sys/class/block"

// partitionWait bounds the wait for a disk driver to announce a partition.
const partitionWait = 10 * time.Second

// findPartition returns the /dev path of the partition whose GPT label is
// label among the block devices listed in dir (sysBlock), waiting up to
// timeout for it.
func findPartition(dir, label string, timeout time.Duration) (string, error) {
	var dev, labels string
	err := waitBlock(timeout, func() bool {
		dev, labels = scanPartitions(dir, label)
		return dev != ""
	})
	switch {
	case dev != "":
		return dev, nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "", fmt.Errorf("no partition labelled %s after %s (partitions: %s)", label, timeout, labels)
	}
	return "", fmt.Errorf("no partition labelled %s (partitions: %s): %w", label, labels, err)
}

// waitBlock calls look until it returns true, at first and then each
// time the kernel adds or changes a block device (announced by a uevent:
// a disk's partitions appear one by one), for up to timeout; after that
// it returns os.ErrDeadlineExceeded. Without uevents, look is called once.
func waitBlock(timeout time.Duration, look func() bool) error {
	// Listen before looking, so that a device added in between is not
	// missed.
	events, err := listenUevents()
	if err != nil {
		if look() {
			return nil
		}
		return fmt.Errorf("block devices cannot be waited for: %w", err)
	}
	defer events.Close()
	events.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 8192)
	for !look() {
		for {
			n, err := events.Read(buf)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return err
			}
			if errors.Is(err, unix.ENOBUFS) {
				break // uevents were lost: look again
			}
			if err != nil {
				return fmt.Errorf("read uevents: %w", err)
			}
			if slices.Contains(strings.Split(string(buf[:n]), "\x00"), "SUBSYSTEM=block") {
				break
			}
		}
	}
	return nil
}

// listenUevents opens a socket on which the kernel's uevents arrive, one
// per read, with read deadlines.
func listenUevents() (*os.File, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		return nil, fmt.Errorf("uevent socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind the uevent socket: %w", err)
	}
	return os.NewFile(uintptr(fd), "uevents"), nil
}

// scanPartitions looks for the partition labelled label among the block
// devices in dir; labels lists the labels seen, for a message.
func scanPartitions(dir, label string) (dev, labels string) {
	uevents, _ := filepath.Glob(filepath.Join(dir, "*", "uevent"))
	var seen []string
	for _, u := range uevents {
		raw, err := os.ReadFile(u)
		if err != nil {
			continue
		}
		var name, devName string
		for line := range strings.SplitSeq(string(raw), "\n") {
			k, v, _ := strings.Cut(line, "=")
			switch k {
			case "PARTNAME":
				name = v
			case "DEVNAME":
				devName = v
			}
		}
		if name == label && devName != "" {
			return "/dev/" + devName, ""
		}
		if name != "" {
			seen = append(seen, devName+" "+name)
		}
	}
	if len(seen) == 0 {
		return "", "none labelled"
	}
	return "", strings.Join(seen, ", ")
}
