//go:build tools

// Package tools names the containerd programs scripts/k8s.sh builds from this module (the
// daemon, its runc shim and ctr), so go.mod and go.sum pin what they need.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
