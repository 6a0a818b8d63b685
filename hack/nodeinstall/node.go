package nodeinstall

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/cachetier/cachetier/hack/cluster"
	"github.com/cachetier/cachetier/hack/imagebuild"
)

// StartNode starts a one-node cluster that runs cachetier (StartNodes).
func StartNode(ctx context.Context, root, dir string, log io.Writer, extraImages ...string) (*Installer, cluster.Options, error) {
	return StartNodes(ctx, root, dir, 1, log, extraImages...)
}

// StartNodes starts a cluster of nodes nodes that runs cachetier: the
// images `make image` built ($CACHETIER_IMAGES) or, without them, images
// built into dir/images; then an installer for it. The caller stops the
// cluster with Teardown. The tests of real nodes (e2e/...) share it so
// each starts its cluster the same way. extraImages (imagebuild names) are
// imported as well, for what a test runs next to cachetier.
func StartNodes(ctx context.Context, root, dir string, nodes int, log io.Writer, extraImages ...string) (*Installer, cluster.Options, error) {
	start := time.Now()
	images, err := imagebuild.Prebuilt(ctx, filepath.Join(dir, "images"), log, append(ImageNames(), extraImages...)...)
	if err != nil {
		return nil, cluster.Options{}, fmt.Errorf("images: %w", err)
	}
	fmt.Fprintf(log, "images ready in %s\n", time.Since(start).Round(time.Second))
	opts := NodeOptions(images, log)
	opts.Nodes = nodes
	image, _ := imagebuild.Find(images, imagebuild.Cachetier)
	start = time.Now()
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		return nil, opts, fmt.Errorf("start cluster: %w", err)
	}
	fmt.Fprintf(log, "cluster of %d node(s) up in %s\n", nodes, time.Since(start).Round(time.Second))
	in, err := New(c, root, dir, image)
	if err != nil {
		return nil, opts, errorsJoin(err, c.Stop())
	}
	in.Images = images
	return in, opts, nil
}

// Teardown stops the cluster; an error says what failed or what the
// teardown left behind.
func (in *Installer) Teardown() error {
	if err := in.Cluster.Stop(); err != nil {
		return fmt.Errorf("tear down the cluster: %w", err)
	}
	if left := in.Cluster.Leftovers(context.Background()); len(left) > 0 {
		return fmt.Errorf("the cluster left behind:\n%s", strings.Join(left, "\n"))
	}
	return nil
}

func errorsJoin(err, stopErr error) error {
	if stopErr != nil {
		return fmt.Errorf("%w (and stopping the node: %v)", err, stopErr)
	}
	return err
}
