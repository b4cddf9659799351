//go:build components

// See ../kubernetes/components.go.
package components

import _ "go.etcd.io/etcd/server/v3"
