//go:build !linux

package proxy

import "errors"

func newDataplane(Config) (dataplane, error) {
	return nil, errors.New("the Service dataplane needs Linux nftables")
}
