package machineconfig

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestInstallValidate(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   Install
		want []FieldError
	}{
		{name: "none"},
		{name: "path", in: Install{Disk: "/dev/vda", Wipe: true}},
		{name: "by-id", in: Install{Disk: "/dev/disk/by-id/virtio-abc"}},
		{name: "selector", in: Install{DiskSelector: &DiskSelector{Size: ">= 8Gi", Model: "QEMU*"}}},
		{name: "both", in: Install{Disk: "/dev/vda", DiskSelector: &DiskSelector{Serial: "x"}},
			want: []FieldError{{"machine.install", "disk and diskSelector both set: give one"}}},
		{name: "not a device", in: Install{Disk: "vda"},
			want: []FieldError{{"machine.install.disk", `"vda" is not a device path: give the whole disk's, such as /dev/vda or /dev/disk/by-id/…`}}},
		{name: "unclean", in: Install{Disk: "/dev/../etc/passwd"},
			want: []FieldError{{"machine.install.disk", `"/dev/../etc/passwd" is not a device path: give the whole disk's, such as /dev/vda or /dev/disk/by-id/…`}}},
		{name: "empty selector", in: Install{DiskSelector: &DiskSelector{}},
			want: []FieldError{{"machine.install.diskSelector", "empty: set size, model or serial"}}},
		{name: "bad size", in: Install{DiskSelector: &DiskSelector{Size: "=> 8Gi"}},
			want: []FieldError{{"machine.install.diskSelector.size", `"=> 8Gi" is not a size test: use a size such as 32Gi, or one after >=, <=, > or <`}}},
		{name: "bad pattern", in: Install{DiskSelector: &DiskSelector{Model: "[QEMU"}},
			want: []FieldError{{"machine.install.diskSelector.model", `"[QEMU" is not a pattern: syntax error in pattern`}}},
		{name: "wipe alone", in: Install{Wipe: true},
			want: []FieldError{{"machine.install.wipe", "set without a disk: give disk or diskSelector"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var v validator
			v.install(&tt.in)
			if diff := cmp.Diff(tt.want, v.errs); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSizeMatch(t *testing.T) {
	const gi = 1 << 30
	for _, tt := range []struct {
		test string
		size int64
		want bool
	}{
		{">= 8Gi", 8 * gi, true},
		{">= 8Gi", 8*gi - 1, false},
		{">8Gi", 8 * gi, false},
		{"<= 2T", 2e12, true},
		{"< 2T", 2e12, false},
		{"32Gi", 32 * gi, true},
		{"== 32Gi", 32*gi + 512, false},
	} {
		match, err := SizeMatch(tt.test)
		if err != nil {
			t.Fatalf("%q: %v", tt.test, err)
		}
		if got := match(tt.size); got != tt.want {
			t.Errorf("%q matches %d: %v, want %v", tt.test, tt.size, got, tt.want)
		}
	}
	if _, err := SizeMatch(">= lots"); err == nil {
		t.Error(`">= lots": no error`)
	}
}
