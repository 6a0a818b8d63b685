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

// StartNode starts a node cluster that runs cachetier: the images `make
// image` built ($CACHETIER_IMAGES) or, without them, images built into
// dir/images; then an installer for it. The caller stops the node with
// Teardown. The tests of a real node (e2e/...) share it so each starts the
// node the same way.
func StartNode(ctx context.Context, root, dir string, log io.Writer) (*Installer, cluster.Options, error) {
	start := time.Now()
	images, err := imagebuild.Prebuilt(ctx, filepath.Join(dir, "images"), log, ImageNames()...)
	if err != nil {
		return nil, cluster.Options{}, fmt.Errorf("images: %w", err)
	}
	fmt.Fprintf(log, "images ready in %s\n", time.Since(start).Round(time.Second))
	opts := NodeOptions(images, log)
	image, _ := imagebuild.Find(images, imagebuild.Cachetier)
	start = time.Now()
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		return nil, opts, fmt.Errorf("start node: %w", err)
	}
	fmt.Fprintf(log, "node cluster up in %s\n", time.Since(start).Round(time.Second))
	in, err := New(c, root, dir, image)
	if err != nil {
		return nil, opts, errorsJoin(err, c.Stop())
	}
	return in, opts, nil
}

// Teardown stops the node; an error says what failed or what the teardown
// left behind.
func (in *Installer) Teardown() error {
	if err := in.Cluster.Stop(); err != nil {
		return fmt.Errorf("tear down the node: %w", err)
	}
	if left := in.Cluster.Leftovers(context.Background()); len(left) > 0 {
		return fmt.Errorf("the node left behind:\n%s", strings.Join(left, "\n"))
	}
	return nil
}

func errorsJoin(err, stopErr error) error {
	if stopErr != nil {
		return fmt.Errorf("%w (and stopping the node: %v)", err, stopErr)
	}
	return err
}
