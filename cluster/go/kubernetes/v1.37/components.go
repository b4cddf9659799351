//go:build components

// The commands this module builds; the build tag keeps this file out of every compile, and it
// only tells `go mod tidy` which packages' dependencies go.sum must hold.
package components

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
