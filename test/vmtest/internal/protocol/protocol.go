// Package protocol is what the host side of vmtest and its guest init
// agree on: where the initramfs holds the test and its config, the
// environment that tells a test it runs in the VM, and the console line
// that reports how the test ended.
package protocol

// Paths in the initramfs.
const (
	ConfigPath = "/vmtest.json"
	TestBinary = "/vmtest.test"
)

// EnvGuest is set, to "1", in the environment of the test binary in the
// VM.
const EnvGuest = "CAIRN_VMTEST_GUEST"

// ResultPrefix starts the last line the guest writes to the console:
// ResultPrefix + "PASS", or ResultPrefix + "FAIL: " and why.
const ResultPrefix = "vmtest-result: "

// Config is the guest's ConfigPath, in JSON.
type Config struct {
	// Test is the -test.run pattern of the one test to run.
	Test string `json:"test"`
	// Timeout is the test binary's -test.timeout.
	Timeout string `json:"timeout"`
	// Modules are the kernel modules to load, in order: paths in the
	// initramfs.
	Modules []string `json:"modules"`
	// Env is added to the test's environment.
	Env []string `json:"env,omitempty"`
}
