package admincli

import (
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/imagebuild"
)

func imageCommand(out io.Writer) *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "The project's own container image"}
	o := imagebuild.Options{}
	build := &cobra.Command{
		Use:   "build --out DIR",
		Short: "Build the image the chart runs (one static binary, non-root, multi-platform) as an OCI layout",
		Long: "Cross-compiles hooks/cmd/in-cluster with CGO_ENABLED=0 for every platform, as /usr/local/bin/kube-gpu-stack with\n" +
			"validator and driver-manager linked to it (no plan, migrate, image or airgap: those run here), and writes one OCI image\n" +
			"index, tagged ghcr.io/kube-gpu-stack/kube-gpu-stack:<version>, as an OCI image layout in --out. No Docker and no\n" +
			"base image: the same source gives the same digest (file times from SOURCE_DATE_EPOCH, else 1970).\n" +
			"`airgap bundle --own-image-layout DIR` takes it in; any OCI-layout-aware tool can push it.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if raw, ok := os.LookupEnv("SOURCE_DATE_EPOCH"); ok && !cmd.Flags().Changed("source-date-epoch") {
				epoch, err := strconv.ParseInt(raw, 10, 64)
				if err != nil {
					return fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since 1970", raw)
				}
				o.SourceDateEpoch = epoch
			}
			o.Log = cmd.ErrOrStderr()
			if err := o.Complete(); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context(), out)
		},
	}
	build.Flags().StringVar(&o.Out, "out", "", "OCI image layout directory to write (an earlier layout there is replaced)")
	build.Flags().StringVar(&o.Version, "version", "", "image tag and version label (default: the chart's appVersion)")
	build.Flags().StringVar(&o.Reference, "reference", "", "full image reference (default ghcr.io/kube-gpu-stack/kube-gpu-stack:<version>)")
	build.Flags().StringSliceVar(&o.Platforms, "platform", imagebuild.DefaultPlatforms, "platforms, os/arch[/variant], comma-separated")
	build.Flags().StringVar(&o.ModuleDir, "module-dir", ".", "root of the kube-gpu-stack source (holds go.mod)")
	build.Flags().StringVar(&o.GoCommand, "go", "go", "go command that builds the binaries")
	build.Flags().Int64Var(&o.SourceDateEpoch, "source-date-epoch", 0, "file times and created time, seconds since 1970 (env SOURCE_DATE_EPOCH)")
	_ = build.MarkFlagRequired("out")
	cmd.AddCommand(build, imagePushCommand(out))
	return cmd
}

func imagePushCommand(out io.Writer) *cobra.Command {
	o := imagebuild.PushOptions{}
	cmd := &cobra.Command{
		Use:   "push --layout DIR --registry REG",
		Short: "Push the image `image build` wrote into your registry and print the values that install from it",
		Long: "Pushes the OCI layout's image index (every platform) to REG/<repository>:<tag> of its name, checks that the\n" +
			"registry serves it at the same digest, and prints the --set flags that make the chart pull it, pinned by digest\n" +
			"(the driver manager keeps its pinned tag, which the push also serves). Credentials come from the Docker config.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context(), out)
		},
	}
	cmd.Flags().StringVar(&o.Layout, "layout", "dist/image", "the OCI layout `DIR` image build wrote")
	cmd.Flags().StringVar(&o.Registry, "registry", "", "your registry, `host[:port][/path]`")
	cmd.Flags().BoolVar(&o.Insecure, "insecure", false, "allow plain HTTP to the registry")
	cmd.Flags().StringVar(&o.CAFile, "ca", "", "PEM `FILE` of CA certificates to trust for the registry, besides the system's")
	return cmd
}
