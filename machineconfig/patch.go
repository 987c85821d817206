package machineconfig

import (
	"bytes"
	"errors"
	"fmt"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"sigs.k8s.io/yaml"
)

// ApplyPatch applies patch to the machine config document doc. Both are
// YAML or JSON. The patch is an RFC 6902 JSON patch when it is a list (of
// operations) and an RFC 7386 merge patch when it is an object. It returns
// the patched document as JSON, unchecked: Parse it to check it.
func ApplyPatch(doc, patch []byte) ([]byte, error) {
	docJSON, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return nil, fmt.Errorf("decode the machine config: %w", err)
	}
	if !bytes.HasPrefix(docJSON, []byte("{")) {
		return nil, errors.New("the machine config is not a YAML or JSON object")
	}
	p, err := yaml.YAMLToJSON(patch)
	if err != nil {
		return nil, fmt.Errorf("decode the patch: %w", err)
	}
	switch {
	case bytes.HasPrefix(p, []byte("[")):
		return applyJSONPatch(docJSON, p)
	case bytes.HasPrefix(p, []byte("{")):
		out, err := jsonpatch.MergePatch(docJSON, p)
		if err != nil {
			return nil, fmt.Errorf("merge patch: %w", err)
		}
		return out, nil
	}
	return nil, errors.New("not a patch: want a list of RFC 6902 operations ([{op: replace, path: /machine/hostname, value: node-2}]) or a merge patch object (machine: {hostname: node-2})")
}

// applyJSONPatch applies an RFC 6902 patch an operation at a time, so
// that an error names the operation.
func applyJSONPatch(doc, patch []byte) ([]byte, error) {
	ops, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		return nil, fmt.Errorf("JSON patch: %w", err)
	}
	for i, op := range ops {
		doc, err = jsonpatch.Patch{op}.Apply(doc)
		if err != nil {
			path, _ := op.Path()
			return nil, fmt.Errorf("JSON patch operation %d (%s %s): %w", i, op.Kind(), path, err)
		}
	}
	return doc, nil
}
