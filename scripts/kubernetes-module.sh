#!/usr/bin/env bash
# Writes the Go module that builds one Kubernetes release for the test cluster:
#   ./scripts/kubernetes-module.sh v1.37.2   → cluster/go/kubernetes/v1.37/{go.mod,go.sum,components.go}
# k8s.io/kubernetes requires every staging module at v0.0.0, which no proxy serves: each is
# replaced by its published v0.MINOR.PATCH, the list being the v0.0.0 lines of that release's own
# go.mod. Run again to move a minor to a newer patch; commit the result (go.sum pins every module).
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: $0 vMAJOR.MINOR.PATCH}
minor=$(echo "$version" | cut -d. -f1,2)
staging=v0.${version#v1.}
dir=cluster/go/kubernetes/$minor
export GOMODCACHE=$PWD/target/cluster/go/mod GOCACHE=$PWD/target/cluster/go/cache GOFLAGS= GOTOOLCHAIN=local
mkdir -p "$dir"
upstream=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
go_line=$(grep -m1 '^go ' "$upstream")
{
  echo "// Builds Kubernetes $version for the test cluster (cargo xtask cluster build); written by"
  echo "// scripts/kubernetes-module.sh: every staging module replaced by its published $staging."
  echo "module observer.dev/cluster/kubernetes/${minor//./_}"
  echo
  echo "$go_line"
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  echo "replace ("
  grep -E '^\s+k8s.io/[a-z0-9-]+ v0\.0\.0$' "$upstream" | awk -v s="$staging" '{printf "\t%s => %s %s\n", $1, $1, s}'
  echo ")"
} >"$dir/go.mod"
cat >"$dir/components.go" <<'GO'
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
GO
(cd "$dir" && go mod tidy)
echo "wrote $dir for Kubernetes $version"
