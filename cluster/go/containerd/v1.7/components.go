//go:build components

// See ../../kubernetes/v1.37/components.go.
package components

import (
	_ "github.com/containerd/containerd/cmd/containerd"
	_ "github.com/containerd/containerd/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/cmd/ctr"
)
