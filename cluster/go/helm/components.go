//go:build components

// See ../kubernetes/components.go.
package components

import _ "helm.sh/helm/v4/cmd/helm"
