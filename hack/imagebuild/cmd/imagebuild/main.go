// Command imagebuild builds the test node's images (cachetier, pause,
// CoreDNS) as OCI archives, without a container engine or a registry, and
// lists them in <out>/images.json. `make image` runs it.
//
//	go run ./hack/imagebuild/cmd/imagebuild [-out bin/images] [-images cachetier,pause,coredns]
//
// Load an archive into a node's containerd with
//
//	ctr -n k8s.io images import <out>/<image>.tar
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/cachetier/cachetier/hack/imagebuild"
)

func main() {
	out := flag.String("out", "", "output directory (default <repo>/bin/images)")
	images := flag.String("images", strings.Join(imagebuild.Names(), ","), "images to build, comma-separated")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "imagebuild: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	built, err := imagebuild.Build(ctx, imagebuild.Options{
		Out:    *out,
		Images: strings.Split(*images, ","),
		Log:    os.Stderr,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(1)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tREF\tDIGEST\tTAR\tSIZE")
	for _, im := range built {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1f MB\n", im.Name, im.Ref, im.Digest, im.Tar, float64(im.Size)/1e6)
	}
	tw.Flush()
}
