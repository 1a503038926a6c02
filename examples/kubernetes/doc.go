// Package kubernetes holds the Kubernetes example's test, in a module of its own so that the
// goharvest module does not depend on Kubernetes packages. See manifests_test.go.
package kubernetes
