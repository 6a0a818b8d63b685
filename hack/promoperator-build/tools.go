//go:build tools

// Package tools keeps the two mains hack/imagebuild builds from this module
// required (go mod tidy drops a module nothing imports).
package tools

import (
	_ "github.com/prometheus-operator/prometheus-operator/cmd/operator"
	_ "github.com/prometheus-operator/prometheus-operator/cmd/prometheus-config-reloader"
)
