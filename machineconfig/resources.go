package machineconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
)

// Resources are the limits of one service, applied to its cgroup v2. A
// field left out sets no limit.
type Resources struct {
	// MemoryMax is memory.max: bytes, or a quantity such as 256Mi or 1G
	// (suffixes k, M, G, T and Ki, Mi, Gi, Ti). Past it the kernel reclaims,
	// then OOM-kills inside the service.
	MemoryMax Quantity `json:"memoryMax,omitempty"`
	// CPUMax is cpu.max, in CPUs: 0.5 or 500m is half a CPU (50 ms in every
	// 100 ms), 2 is two CPUs. At least 10m.
	CPUMax Quantity `json:"cpuMax,omitempty"`
	// CPUWeight is cpu.weight, 1..10000 (100 when unset): the service's
	// share of CPU time when CPUs are contended.
	CPUWeight int64 `json:"cpuWeight,omitempty"`
	// PidsMax is pids.max: how many processes and threads the service may
	// have at once.
	PidsMax int64 `json:"pidsMax,omitempty"`
}

// MachineResources are the limits of the node's built-in services.
type MachineResources struct {
	Containerd Resources `json:"containerd,omitzero"`
	Agent      Resources `json:"agent,omitzero"`
}

// CPUPeriod is the cpu.max period, in microseconds, that CPUMax is a share
// of.
const CPUPeriod = 100_000

// Quantity is a size or an amount written as a string ("256Mi", "500m") or
// a bare number. It is checked by Validate, with the field's path.
type Quantity string

// UnmarshalJSON takes a JSON string or number.
func (q *Quantity) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return err
	}
	switch v := v.(type) {
	case string:
		*q = Quantity(v)
	case json.Number:
		*q = Quantity(v.String())
	default:
		return fmt.Errorf("%s is not a quantity: want a number or a string such as 256Mi", b)
	}
	return nil
}

var (
	bytesRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)(k|M|G|T|Ki|Mi|Gi|Ti)?$`)
	cpuRE   = regexp.MustCompile(`^(?:([0-9]+)m|([0-9]+(?:\.[0-9]{1,3})?))$`)
)

var byteSuffixes = map[string]float64{
	"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
	"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
}

var errNotSet = errors.New("not set")

// Bytes returns a memory quantity in bytes (fractions of a byte dropped).
func (q Quantity) Bytes() (int64, error) {
	if q == "" {
		return 0, errNotSet
	}
	m := bytesRE.FindStringSubmatch(string(q))
	if m == nil {
		return 0, fmt.Errorf("%q is not a memory size: use bytes or a quantity such as 256Mi or 1G", string(q))
	}
	n, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, err
	}
	b := n * byteSuffixes[m[2]]
	if b >= math.MaxInt64 {
		return 0, fmt.Errorf("%q is too large", string(q))
	}
	return int64(b), nil
}

// MilliCPUs returns a CPU quantity in thousandths of a CPU.
func (q Quantity) MilliCPUs() (int64, error) {
	if q == "" {
		return 0, errNotSet
	}
	m := cpuRE.FindStringSubmatch(string(q))
	if m == nil {
		return 0, fmt.Errorf("%q is not a CPU amount: use CPUs such as 0.5 or 2, or thousandths such as 500m", string(q))
	}
	if m[1] != "" {
		return strconv.ParseInt(m[1], 10, 64)
	}
	whole, frac, _ := bytes.Cut([]byte(m[2]), []byte("."))
	w, err := strconv.ParseInt(string(whole), 10, 64)
	if err != nil || w > math.MaxInt64/1000 {
		return 0, fmt.Errorf("%q is too large", string(q))
	}
	f, _ := strconv.ParseInt(string(frac)+"000"[len(frac):], 10, 64)
	return w*1000 + f, nil
}

// CPUQuota returns CPUMax as the quota of cpu.max in microseconds per
// CPUPeriod, 0 when CPUMax is not set or not valid.
func (r *Resources) CPUQuota() int64 {
	m, err := r.CPUMax.MilliCPUs()
	if err != nil {
		return 0
	}
	return m * CPUPeriod / 1000
}

// MemoryBytes returns MemoryMax in bytes, 0 when it is not set or not
// valid.
func (r *Resources) MemoryBytes() int64 {
	b, err := r.MemoryMax.Bytes()
	if err != nil {
		return 0
	}
	return b
}

const (
	minMemoryMax = 1 << 20 // a smaller memory.max is surely a missing suffix
	minMilliCPUs = 10      // the kernel's least cpu.max quota is 1 ms per 100 ms
	maxCPUWeight = 10000
)

func (v *validator) resources(p string, r *Resources) {
	if r.MemoryMax != "" {
		switch b, err := r.MemoryMax.Bytes(); {
		case err != nil:
			v.add(p+".memoryMax", "%v", err)
		case b < minMemoryMax:
			v.add(p+".memoryMax", "%d bytes is less than 1Mi: add a suffix, e.g. %sMi", b, string(r.MemoryMax))
		}
	}
	if r.CPUMax != "" {
		switch m, err := r.CPUMax.MilliCPUs(); {
		case err != nil:
			v.add(p+".cpuMax", "%v", err)
		case m < minMilliCPUs:
			v.add(p+".cpuMax", "%q is less than 10m, the least the kernel allows (1 ms in every 100 ms)", string(r.CPUMax))
		case m > math.MaxInt64/CPUPeriod:
			v.add(p+".cpuMax", "%q is too large", string(r.CPUMax))
		}
	}
	if r.CPUWeight != 0 && (r.CPUWeight < 1 || r.CPUWeight > maxCPUWeight) {
		v.add(p+".cpuWeight", "%d is out of range 1..%d", r.CPUWeight, maxCPUWeight)
	}
	if r.PidsMax < 0 {
		v.add(p+".pidsMax", "%d is negative: use at least 1, or leave it out for no limit", r.PidsMax)
	}
}
