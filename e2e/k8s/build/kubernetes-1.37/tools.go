//go:build tools

// Package tools names the upstream programs scripts/k8s.sh builds from this module: the
// Kubernetes components, the e2e test binary's dependencies, agnhost and the conformance
// image's runner. Nothing here is compiled; the blank imports keep go.mod and go.sum
// holding exactly what those programs need, pinned.
package tools

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/conformance/image/go-runner"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/e2e/network/netpol"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
