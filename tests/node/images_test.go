package node

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/node/simnvml/build"
)

// Stand-in images for the third-party operands the suite runs, tagged with the references the chart renders.
const (
	driverImage = "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04"
	// nextDriverTag is the driver a `helm upgrade` changes to: the same stand-in under the tag the chart renders
	nextDriverTag   = "600.20.01"
	nextDriverImage = "nvcr.io/nvidia/driver:" + nextDriverTag + "-ubuntu22.04"
	toolkitImage    = "nvcr.io/nvidia/k8s/container-toolkit:v1.20.0"
	probeImage      = "kube-gpu-stack.test/apiprobe:1"
)

// projectTag is the project image's tag (the chart's appVersion).
var projectTag string

// importImages builds the project's image, the stand-ins and the probe, imports them in one archive, and writes
// the nvidia runtime stand-in's injection list. It returns the driver files it built (path in the driver root ->
// file here).
func importImages(ctx context.Context, n *Node, runtimeBin string) error {
	start := time.Now()
	files, err := DriverFiles(ctx, filepath.Join(n.Dir, "driver-files"))
	if err != nil {
		return err
	}
	images := map[string]v1.Image{}
	ref, img, err := ProjectImage(ctx, n.ModuleDir)
	if err != nil {
		return fmt.Errorf("project image: %w", err)
	}
	images[ref] = img
	projectTag = ref[strings.LastIndex(ref, ":")+1:]
	driver, err := StandIn(driverImage, "./tests/node/standin/driver")
	if err != nil {
		return err
	}
	// the driver root's NVML answers for the fixture host's GPU (the toolkit's CDI generation asks it the driver's
	// version), as the real driver's does for the node's
	nvml, err := build.Build(ctx, n.ModuleDir, "")
	if err != nil {
		return fmt.Errorf("the driver root's simulated NVML: %w", err)
	}
	files[nvmlPath] = filepath.Join(n.Dir, "driver-files", "libnvidia-ml.so."+standInDriverVersion)
	if err := standInGPUs.Embed(nvml, files[nvmlPath]); err != nil {
		return err
	}
	driver.Files = files // the driver root the real image installs
	maps.Copy(driver.Links, DriverLinks)
	toolkit, err := StandIn(toolkitImage, "./tests/node/standin/toolkit")
	if err != nil {
		return err
	}
	for _, g := range []GoImage{
		{Ref: probeImage, Package: "./tests/node/standin/apiprobe", Binary: "/apiprobe", User: "65532"},
		driver, toolkit,
	} {
		img, err := g.Build(ctx, n.ModuleDir)
		if err != nil {
			return err
		}
		images[g.Ref] = img
	}
	images[nextDriverImage] = images[driverImage]
	archive := filepath.Join(n.Dir, "images.tar")
	if err := WriteArchive(archive, images); err != nil {
		return err
	}
	if err := n.Import(ctx, archive); err != nil {
		return err
	}
	fmt.Printf("tests/node: %d images built and imported in %s\n", len(images), time.Since(start).Round(100*time.Millisecond))
	return nil
}
