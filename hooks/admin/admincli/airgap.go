package admincli

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/airgap"
)

func airgapCommand(out io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "airgap",
		Short: "Install without internet access: bundle a release, then mirror its images into a private registry",
	}
	cmd.AddCommand(airgapBundleCommand(out), airgapMirrorCommand(out), airgapKeygenCommand(out))
	return cmd
}

func airgapBundleCommand(out io.Writer) *cobra.Command {
	o := airgap.BundleOptions{}
	cmd := &cobra.Command{
		Use:   "bundle",
		Short: "Write one tarball with the packaged chart and every image it can run",
		Long: "Packages the chart (every operand chart inside), pulls every image its images.txt lists by digest (multi-arch\n" +
			"images whole) into one OCI image layout where shared layers are stored once, takes the project's own image from\n" +
			"--own-image-layout (`kube-gpu-stack image build --out DIR`), and writes them with images.txt (digests),\n" +
			"values-airgap.yaml and SHA256SUMS into <chart>-<version>-airgap.tar. Registry credentials come from the\n" +
			"Docker config (docker login). It needs free space for the bundle twice while it works.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Progress = cmd.ErrOrStderr()
			if err := o.Complete(); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context(), out)
		},
	}
	cmd.Flags().StringVar(&o.ChartDir, "chart", "charts/kube-gpu-stack", "the chart `DIR` to bundle")
	cmd.Flags().StringVar(&o.ImagesFile, "images", "", "the image list `FILE` (default <chart>/images.txt)")
	cmd.Flags().StringVar(&o.OwnImageLayout, "own-image-layout", "", "OCI layout `DIR` holding the project's own image (kube-gpu-stack image build --out DIR)")
	cmd.Flags().StringVar(&o.OwnImage, "own-image", "", "the own image's `REF` in the list (default: the one of repository "+airgap.OwnRepository+")")
	cmd.Flags().StringVar(&o.Upstream, "upstream", "", "pull every image from registry `REG` (host[:port][/path]) under the same repository path instead of its own: a mirror of the upstream registries")
	cmd.Flags().BoolVar(&o.Insecure, "insecure", false, "allow plain HTTP to the registries pulled from")
	cmd.Flags().StringVar(&o.Out, "out", "", "the tarball `FILE` to write (default <chart>-<version>-airgap.tar)")
	cmd.Flags().StringVar(&o.SigningKey, "sign-key", "", "sign SHA256SUMS with the Ed25519 private key `FILE` (PEM, PKCS #8: airgap keygen, or openssl genpkey -algorithm ed25519) into SHA256SUMS.sig")
	cmd.Flags().StringVar(&o.CommandSums, "command-sums", "", "carry `FILE`, the release's sha256sum list of its kube-gpu-stack command binaries, under the bundle's sums and signature; airgap mirror writes it out")
	return cmd
}

func airgapKeygenCommand(out io.Writer) *cobra.Command {
	var prefix string
	cmd := &cobra.Command{
		Use:   "keygen --out PREFIX",
		Short: "Write a new Ed25519 key pair for signing bundles: PREFIX.key (private) and PREFIX.pub",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if prefix == "" {
				return errors.New("--out: name the key files' PREFIX")
			}
			private, public, err := airgap.GenerateKeys(prefix)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "wrote %s (keep it secret: airgap bundle --sign-key %s) and %s (give it to whoever mirrors: airgap mirror --verify-key %s)\n",
				private, private, public, public)
			return nil
		},
	}
	cmd.Flags().StringVar(&prefix, "out", "", "write `PREFIX`.key and PREFIX.pub (never over existing files)")
	return cmd
}

func airgapMirrorCommand(out io.Writer) *cobra.Command {
	o := airgap.MirrorOptions{}
	cmd := &cobra.Command{
		Use:   "mirror --registry REG [--sha256 HEX] [--verify-key FILE] [--force] [--allow-downgrade] [--insecure] [--ca FILE] BUNDLE",
		Short: "Push a bundle's images into a private registry and print the helm install line for it",
		Long: "Verifies the whole of BUNDLE before pushing anything: the tarball against --sha256 when given, every file\n" +
			"against SHA256SUMS, every blob against its digest, every manifest against its descriptor (a bundle failing any\n" +
			"of these pushes nothing). A tag the registry already has at another digest is left alone and fails the mirror\n" +
			"before anything is pushed, unless --force. A bundle of an older release than one the registry already holds\n" +
			"(this project's image at a newer version) fails the mirror before anything is pushed, unless --allow-downgrade:\n" +
			"an old bundle brings back its release's flaws, even signed. It then pushes each image to REG/<repository>:<tag> unless the\n" +
			"registry already has it there, verifies each by digest, copies the chart archive to --out and prints the helm\n" +
			"install line with --set global.imageRegistry=REG. Running it again pushes nothing. Registry credentials come\n" +
			"from the Docker config (docker login).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Bundle = args[0]
			o.Progress = cmd.ErrOrStderr()
			o.Complete()
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context(), out)
		},
	}
	cmd.Flags().StringVar(&o.Registry, "registry", "", "the private registry `REG`, host[:port][/path] (required)")
	cmd.Flags().BoolVar(&o.Insecure, "insecure", false, "allow plain HTTP to the registry")
	cmd.Flags().StringVar(&o.SHA256, "sha256", "", "the bundle tarball's SHA-256 `HEX`, as published with it: any other bundle is refused before it is read (costs one more read of the file)")
	cmd.Flags().StringVar(&o.VerifyKey, "verify-key", "", "refuse the bundle unless its SHA256SUMS.sig verifies with the Ed25519 public key `FILE` (PEM): checked before anything else of the bundle is trusted")
	cmd.Flags().BoolVar(&o.Force, "force", false, "move tags the registry already has at another digest to the bundle's images")
	cmd.Flags().BoolVar(&o.AllowDowngrade, "allow-downgrade", false, "mirror a bundle older than a release the registry already holds")
	cmd.Flags().StringVar(&o.CAFile, "ca", "", "PEM `FILE` of CA certificates to trust for the registry's TLS, besides the system's")
	cmd.Flags().StringVar(&o.Out, "out", ".", "folder `DIR` to copy the chart archive to, for the helm install line")
	return cmd
}
