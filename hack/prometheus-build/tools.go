//go:build tools

// Package tools keeps the Prometheus main hack/imagebuild builds from this
// module required (go mod tidy drops a module nothing imports).
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
